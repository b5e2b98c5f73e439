"""The pods room follows the node's pods through a feed: list, then watch from the list's
version; a watch that ends or breaks resumes from its newest version, a ``410 Gone`` lists again;
each change reaches the store at once, and the scheduler's reclaims on the pods reach the intake.
The feed here is a scripted stand-in for the port (:class:`nodeagent.core.ports.Feed`)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from nodeagent.adapters.calls import ApiCalls, WatchExpired
from nodeagent.adapters.follow import WatchSettings
from nodeagent.core.events import Notice, Pod, PodKey, PodUid, Tracked
from nodeagent.core.ports import Change
from nodeagent.core.store import Store
from nodeagent.wiring.pods import PodList
from tests.unit.nodeagent.scripted_feed import Scripted, until

LEAVE_BY = datetime(2026, 11, 30, 10, 2, tzinfo=UTC)
W0 = Pod(PodKey("ns/w0"), PodUid("u0"))
W1 = Pod(PodKey("ns/w1"), PodUid("u1"))
W1_RECLAIMED = Pod(PodKey("ns/w1"), PodUid("u1"), leave_by=LEAVE_BY, reclaimed_for="ml/big")


class ScriptedFeed(Scripted[Pod]):
    """The scripted pod feed, and the reads a restore makes."""

    last_ok = 0.0
    dry_run = False
    #: While set, a list (read when it begins) is answered only once this is set.
    held: threading.Event | None = None

    def list_at(self) -> tuple[list[Pod], str]:
        answer = super().list_at()
        if self.held is not None:
            self.held.wait(10)
        return answer

    def read_revocation(self) -> list[Tracked]:
        return []

    def list_pods(self) -> list[Pod]:
        return self.list_at()[0]


class Reclaims:
    def __init__(self) -> None:
        self.seen: list[list[Notice]] = []

    def __call__(self, notices: Sequence[Notice]) -> None:
        self.seen.append(list(notices))


async def following(
    feed: ScriptedFeed, store: Store, reclaims: Reclaims
) -> tuple[PodList, asyncio.Task[None]]:
    pods = PodList(
        store,
        feed,  # type: ignore[arg-type]  # only the reads a restore makes are used
        ApiCalls(timeout=5, concurrency=1),
        clock=lambda: LEAVE_BY,
        wake=lambda: None,
        feed=feed,
        retry_after=0.05,
        watch=WatchSettings(retry_after=0.05, max_backoff=0.1),
        reclaims=reclaims,
    )
    task = asyncio.create_task(pods.run())
    await until(lambda: pods.watching)
    return pods, task


async def stop(pods: PodList, task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await pods.stop()


async def test_changes_reach_the_store_and_a_reclaim_the_intake_as_they_come() -> None:
    feed, store, reclaims = ScriptedFeed([W0]), Store(), Reclaims()
    pods, task = await following(feed, store, reclaims)
    try:
        assert feed.watched_from == ["10"]
        feed.steps.put(Change(W1, gone=False, version="11"))
        await until(lambda: store.pod(W1.uid) is not None)
        feed.steps.put(Change(W1_RECLAIMED, gone=False, version="12"))
        await until(lambda: bool(reclaims.seen[-1]))
        [reclaim] = reclaims.seen[-1]
        assert (reclaim.source, reclaim.deadline, reclaim.scope) == (
            "scheduler",
            LEAVE_BY,
            frozenset({W1.key}),
        )
        # The scheduler withdraws it: the reclaim is gone from the next complete set.
        feed.steps.put(Change(W1, gone=False, version="13"))
        await until(lambda: reclaims.seen[-1] == [])
        feed.steps.put(Change(W0, gone=True, version="14"))
        await until(lambda: store.pod(W0.uid) is None)
        assert feed.lists == 1  # one list, then only the watch
    finally:
        await stop(pods, task)


async def test_an_ended_or_broken_watch_resumes_from_its_newest_version() -> None:
    feed, store, reclaims = ScriptedFeed([W0]), Store(), Reclaims()
    pods, task = await following(feed, store, reclaims)
    try:
        feed.steps.put(Change(None, gone=False, version="20"))  # a bookmark
        feed.steps.put("end")
        await until(lambda: len(feed.watched_from) == 2)
        feed.steps.put(Change(W1, gone=False, version="21"))
        feed.steps.put(ConnectionResetError("the watch broke"))
        await until(lambda: len(feed.watched_from) == 3)
        assert feed.watched_from == ["10", "20", "21"]
        assert feed.lists == 1
        assert store.pod(W1.uid) is not None
    finally:
        await stop(pods, task)


async def test_a_watch_too_old_lists_again_and_the_list_replaces_what_was_known() -> None:
    feed, store, reclaims = ScriptedFeed([W0, W1]), Store(), Reclaims()
    pods, task = await following(feed, store, reclaims)
    try:
        feed.listed, feed.version = [W1_RECLAIMED], "50"  # w0 left while nobody watched
        feed.steps.put(WatchExpired("too old resource version"))
        await until(lambda: feed.watched_from[-1:] == ["50"])
        assert feed.lists == 2
        assert store.pod(W0.uid) is None
        assert [n.scope for n in reclaims.seen[-1]] == [frozenset({W1.key})]
    finally:
        await stop(pods, task)


async def test_a_list_for_a_caller_while_watching_only_adds_pods_not_known() -> None:
    feed, store, reclaims = ScriptedFeed([W0]), Store(), Reclaims()
    pods, task = await following(feed, store, reclaims)
    try:
        # A caller's list begins (it reads w0 and w1); the watch sees w0 go before the list is
        # answered. The older list must not bring w0 back; the new pod is taken.
        feed.held = threading.Event()
        feed.listed = [W0, W1]
        lists = feed.lists
        refresh = asyncio.create_task(pods.refresh())
        await until(lambda: feed.lists > lists)
        feed.steps.put(Change(W0, gone=True, version="11"))
        await until(lambda: store.pod(W0.uid) is None)
        feed.held.set()
        await refresh
        assert store.pod(W0.uid) is None
        assert store.pod(W1.uid) is not None
    finally:
        await stop(pods, task)


@pytest.mark.reliability
async def test_pods_that_go_while_watched_are_not_remembered_once_no_list_needs_them() -> None:
    """The pods room once kept every pod the watch saw go until the next whole list (a watch
    that is never too old never lists again): a node running short jobs for months grew with
    each. Now only a caller's list under way needs them, and they are let go once it answers."""
    feed, store, reclaims = ScriptedFeed([]), Store(), Reclaims()
    pods, task = await following(feed, store, reclaims)
    try:
        published = len(reclaims.seen)
        for n in range(200):
            pod = Pod(PodKey(f"ns/job{n}"), PodUid(f"job{n}"))
            feed.steps.put(Change(pod, gone=False, version=str(20 + 2 * n)))
            feed.steps.put(Change(pod, gone=True, version=str(21 + 2 * n)))
        # Each change is handed to the store and the intake: 400 of them.
        await until(lambda: len(reclaims.seen) == published + 400)
        assert store.pods() == ()
        assert pods._gone == set()
        # A caller's list answered after a pod went, with it still there, is not taken.
        feed.held = threading.Event()
        feed.listed = [W1]
        lists = feed.lists
        refresh = asyncio.create_task(pods.refresh())
        await until(lambda: feed.lists > lists)
        feed.steps.put(Change(W1, gone=False, version="500"))
        feed.steps.put(Change(W1, gone=True, version="501"))
        await until(lambda: W1.uid in pods._gone)
        feed.held.set()
        await refresh
        assert store.pod(W1.uid) is None
        assert pods._gone == set()
    finally:
        await stop(pods, task)
