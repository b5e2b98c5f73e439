"""The pods room follows the node's pods through a feed: list, then watch from the list's
version; a watch that ends or breaks resumes from its newest version, a ``410 Gone`` lists again;
each change reaches the store at once, and the scheduler's reclaims on the pods reach the intake.
The feed here is a scripted stand-in for the port (:class:`nodeagent.adapters.calls.Feed`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime

from nodeagent.adapters.calls import ApiCalls, Change, WatchExpired
from nodeagent.adapters.follow import WatchSettings
from nodeagent.core.events import Notice, Pod, PodKey, PodUid, Tracked
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
        feed.steps.put(Change(W0, gone=True, version="11"))
        await until(lambda: store.pod(W0.uid) is None)
        # An older list (it still shows w0) must not bring w0 back; a new pod is taken.
        feed.listed = [W0, W1]
        await pods.refresh()
        assert store.pod(W0.uid) is None
        assert store.pod(W1.uid) is not None
    finally:
        await stop(pods, task)
