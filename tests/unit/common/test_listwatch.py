"""The list/watch loop both programs share: what it lists and watches from, what a 410 and any
other failure lead to, and its two drivers, against plain fakes of a transport."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from common import listwatch
from common.listwatch import Cursor, Gone, Hooks, List, Policy, Wait, Watch, WatchError


@dataclass
class Told:
    expired: list[Exception]
    failed: list[Exception]

    @classmethod
    def hooks(cls, *, absent: type[Exception] | None = None) -> tuple[Told, Hooks]:
        told = cls([], [])

        def is_absent(exc: Exception) -> bool:
            return absent is not None and isinstance(exc, absent)

        return told, Hooks(expired=told.expired.append, failed=told.failed.append, absent=is_absent)


def test_lists_then_watches_from_the_newest_version_and_relists_on_410() -> None:
    cursor = Cursor()
    told, hooks = Told.hooks()
    loop = listwatch.steps(cursor, Policy(watch_timeout=300), hooks, clock=lambda: 0.0)
    assert next(loop) == List()
    cursor.listed("10", 0.0)
    assert next(loop) == Watch("10", 300)
    open_now = [cursor.watching]
    cursor.seen("11")  # a change
    cursor.seen("12")  # a bookmark
    assert next(loop) == Watch("12", 300)  # the server ended the watch: resume from there
    assert loop.throw(Gone("too old")) == List()
    assert [str(e) for e in told.expired] == ["too old"]
    assert told.failed == []
    open_now.append(cursor.watching)
    assert open_now == [True, False]  # open while watching, not while listing again
    cursor.listed("20", 0.0)
    assert next(loop) == Watch("20", 300)


def test_other_failures_are_told_and_retried_with_a_capped_backoff_resuming_where_it_broke() -> (
    None
):
    cursor = Cursor()
    told, hooks = Told.hooks()
    loop = listwatch.steps(cursor, Policy(retry_after=0.5, max_backoff=2.0), hooks)
    assert next(loop) == List()
    cursor.listed("7", 0.0)
    assert next(loop) == Watch("7", 300)
    waits = []
    for _ in range(4):
        step = loop.throw(ConnectionResetError("connection reset"))
        assert isinstance(step, Wait)
        waits.append(step.seconds)
        assert cursor.error == "connection reset"
        assert next(loop) == Watch("7", 300)  # no list: the watch resumes from its version
    assert waits == [0.5, 1.0, 2.0, 2.0]
    assert len(told.failed) == 4
    assert told.expired == []
    cursor.seen("")  # the watch was answered
    assert cursor.error is None
    assert next(loop) == Watch("7", 300)
    assert loop.throw(RuntimeError("again")) == Wait(0.5)  # a good watch reset the backoff


def test_a_failed_list_is_a_failure_even_when_it_is_a_410_and_is_listed_again() -> None:
    cursor = Cursor()
    told, hooks = Told.hooks()
    loop = listwatch.steps(cursor, Policy(), hooks)
    assert next(loop) == List()
    assert loop.throw(Gone("continue token expired")) == Wait(0.5)
    assert told.expired == []
    assert cursor.error == "continue token expired"
    assert next(loop) == List()


def test_a_kind_not_served_is_asked_for_again_after_the_longest_backoff() -> None:
    cursor = Cursor()
    told, hooks = Told.hooks(absent=LookupError)
    loop = listwatch.steps(cursor, Policy(max_backoff=10.0), hooks)
    assert next(loop) == List()
    assert loop.throw(LookupError("404")) == Wait(10.0)
    assert next(loop) == List()
    assert told.failed == []


def test_a_list_is_repeated_once_relist_every_has_passed_and_not_before() -> None:
    now = [0.0]
    cursor = Cursor()
    cursor.listed("5", 0.0)  # the owner listed before the loop started
    loop = listwatch.steps(cursor, Policy(relist_every=60.0), Hooks(), clock=lambda: now[0])
    assert next(loop) == Watch("5", 300)
    now[0] = 59.0
    assert next(loop) == Watch("5", 300)
    now[0] = 61.0
    assert next(loop) == List()


def test_spread_watches_and_jittered_waits_stay_in_their_ranges() -> None:
    cursor = Cursor()
    policy = Policy(
        watch_timeout=100, watch_spread=2.0, retry_after=1.0, max_backoff=1.0, jitter=0.5
    )
    loop = listwatch.steps(cursor, policy, Hooks(), rng=random.Random(7))
    assert next(loop) == List()
    cursor.listed("1", 0.0)
    timeouts, waits = set(), set()
    for _ in range(50):
        step = next(loop)
        assert isinstance(step, Watch)
        assert 100 <= step.timeout <= 200
        wait = loop.throw(OSError("down"))
        assert isinstance(wait, Wait)
        assert 0.5 <= wait.seconds <= 1.0
        timeouts.add(step.timeout)
        waits.add(wait.seconds)
    assert len(timeouts) > 1
    assert len(waits) > 1


def test_decode_reads_changes_bookmarks_and_errors() -> None:
    added = listwatch.decode(
        json.dumps({"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "3"}}})
    )
    assert (added.type, added.object["metadata"]["name"], added.version) == ("ADDED", "a", "3")
    assert listwatch.decode(b'{"type":"BOOKMARK","object":{"metadata":{}}}').version == ""
    with pytest.raises(Gone, match="too old"):
        listwatch.decode({"type": "ERROR", "object": {"code": 410, "message": "too old"}})
    with pytest.raises(WatchError, match="forbidden"):
        listwatch.decode({"type": "ERROR", "object": {"code": 403, "message": "forbidden"}})


@dataclass(frozen=True)
class Item:
    name: str
    version: str


class Source:
    """A transport: lists answer ``listed`` at ``at``; each watch plays the next script (items,
    then an exception if one ends it)."""

    def __init__(self, cursor: Cursor, scripts: list[list[Item | Exception]]) -> None:
        self.cursor = cursor
        self.scripts = scripts
        self.lists = 0
        self.watched_from: list[str] = []
        self.listed_at = ["10", "20", "30"]
        self.done = threading.Event()

    def relist(self) -> None:
        self.cursor.listed(self.listed_at[self.lists], 0.0)
        self.lists += 1

    def watch(self, version: str, timeout: int) -> Iterator[Item]:
        self.watched_from.append(version)
        if not self.scripts:
            self.done.set()
            return
        for step in self.scripts.pop(0):
            if isinstance(step, Exception):
                raise step
            yield step

    def stop_watch(self) -> None:
        self.done.set()


def scripts() -> list[list[Item | Exception]]:
    return [
        [Item("a", "11"), Item("b", "12")],  # ended by the server
        [Item("c", "13"), ConnectionResetError("broken")],
        [Gone("too old")],
        [Item("d", "21")],
    ]


def test_the_blocking_driver_follows_a_transport_until_stopped() -> None:
    cursor = Cursor()
    source = Source(cursor, scripts())
    seen: list[str] = []
    stop = threading.Event()
    told, hooks = Told.hooks()

    def changed(item: Item) -> None:
        seen.append(item.name)

    def run() -> None:
        listwatch.run_blocking(
            listwatch.steps(cursor, Policy(retry_after=0.01), hooks),
            cursor,
            relist=source.relist,
            watch=source.watch,
            changed=changed,
            stop=stop,
        )

    thread = threading.Thread(target=run)
    thread.start()
    assert source.done.wait(10)
    stop.set()
    thread.join(10)
    assert not thread.is_alive()
    assert seen == ["a", "b", "c", "d"]
    assert source.watched_from[:5] == ["10", "12", "13", "20", "21"]
    assert source.lists == 2
    assert [str(e) for e in told.failed] == ["broken"]
    assert [str(e) for e in told.expired] == ["too old"]


async def test_the_async_driver_hands_changes_to_the_event_loop_in_order() -> None:
    cursor = Cursor()
    source = Source(cursor, scripts())
    seen: list[tuple[str, str]] = []
    told, hooks = Told.hooks()

    async def relist() -> None:
        source.relist()

    def changed(item: Item) -> None:
        seen.append((item.name, cursor.version))

    watch = listwatch.AsyncWatch(source.watch, source.stop_watch, name="test-watch")
    task = asyncio.create_task(
        listwatch.run_async(
            listwatch.steps(cursor, Policy(retry_after=0.01), hooks),
            cursor,
            relist=relist,
            source=watch,
            changed=changed,
        )
    )
    assert await asyncio.to_thread(source.done.wait, 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Each change reaches the owner after the cursor has its version.
    assert seen == [("a", "11"), ("b", "12"), ("c", "13"), ("d", "21")]
    assert source.watched_from[:5] == ["10", "12", "13", "20", "21"]
    assert [str(e) for e in told.failed] == ["broken"]
    assert [str(e) for e in told.expired] == ["too old"]
