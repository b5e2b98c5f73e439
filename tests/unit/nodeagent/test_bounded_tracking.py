"""A long-running agent sees notices and pods come and go for months: what it tracks per notice
or per pod is let go with the notice or the pod, so its memory does not grow with every notice
and pod it ever saw. The store is the one owner of that state (docs/architecture.md)."""

from __future__ import annotations

import collections
import types
from datetime import UTC, datetime, timedelta
from typing import cast

import pytest

from nodeagent.adapters.metrics import Metrics
from nodeagent.core.events import EventId, Kind, Notice, NotifyPod, Pod, PodKey, PodUid
from nodeagent.core.store import AckOutcome, Store
from nodeagent.wiring.board import NoticeBoard
from nodeagent.wiring.channels import Channels
from nodeagent.wiring.drain import DrainWatch
from nodeagent.wiring.intake import Intake
from nodeagent.wiring.pods import PodList

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def notice(n: int, channel: str) -> Notice:
    return Notice(
        event_id=EventId(f"{channel}-{n}"),
        source="aws",
        channel=channel,
        kind=Kind.TERMINATE,
        deadline=T0 + timedelta(minutes=2),
        reason="spot",
    )


def worker(n: int) -> Pod:
    return Pod(key=PodKey(f"ns/w{n}"), uid=PodUid(f"uid-w{n}"), worker=True)


def test_notices_that_come_and_go_leave_no_tracking_behind() -> None:
    metrics = Metrics()
    store = Store()
    intake = Intake(
        store, Channels(metrics), metrics, node_name="n1", clock=lambda: T0, wake=lambda: None
    )
    for n in range(2000):
        # two channels, each holding one notice at a time that the next read replaces
        intake.observed("aws/spot", [notice(n, "aws/spot")])
        intake.observed("aws/rebalance", [notice(n, "aws/rebalance")] if n % 3 else [])
        live = {t.notice.event_id for t in store.active()}
        assert store.detected_at(notice(n, "aws/spot").event_id) is not None
        assert store.footprint()["detected"] <= len(live) <= 2
    assert store.detected_at(notice(0, "aws/spot").event_id) is None
    intake.observed("aws/spot", [])
    intake.observed("aws/rebalance", [])
    assert store.active() == ()
    assert store.footprint() == {"notices": 0, "pods": 0, "detected": 0, "told": 0, "drained": 0}


def test_the_store_keeps_nothing_of_ten_thousand_notices_and_pods_that_came_and_went() -> None:
    store = Store()
    peak: collections.Counter[str] = collections.Counter()
    for n in range(10_000):
        pod, spot = worker(n), notice(n, "aws")
        store.set_pods([pod])
        store.observe("aws", [spot], T0, detected=float(n))
        assert store.heard(pod.uid, spot, at=float(n))
        store.record(NotifyPod(pod, spot), ok=True, now=T0)
        peak |= collections.Counter(store.footprint())
        store.set_pods([])  # the pod left (evicted): the node has drained under the notice
        assert store.newly_drained() == spot
        assert store.newly_drained() is None  # said once
        peak |= collections.Counter(store.footprint())
    assert dict(peak) == {"notices": 1, "pods": 1, "detected": 1, "told": 1, "drained": 1}
    store.observe("aws", [], T0)
    assert store.footprint() == {"notices": 0, "pods": 0, "detected": 0, "told": 0, "drained": 0}


class _Watches:
    """Every pod has one open watch that receives what it is told."""

    def publish(self, uid: PodUid, notice: Notice | None, *, withdrawn: bool = False) -> int:
        return 1

    def watchers(self) -> int:
        return 1


def _entries(*roots: object) -> int:
    """How many entries the containers reachable from ``roots`` hold (dicts, sets, lists,
    tuples, deques, through instance attributes), the prometheus metrics and the loggers aside:
    what grows when a room keeps something per notice or per pod."""
    seen: set[int] = set()
    stack: list[object] = list(roots)
    total = 0
    while stack:
        item = stack.pop()
        if id(item) in seen or isinstance(
            item, (str, bytes, int, float, type, types.ModuleType, types.FunctionType)
        ):
            continue
        seen.add(id(item))
        if isinstance(item, (types.MethodType, Metrics)) or type(item).__module__.startswith(
            ("prometheus_client", "structlog", "asyncio", "threading", "concurrent")
        ):
            continue
        if isinstance(item, dict):
            total += len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (set, frozenset, list, tuple, collections.deque)):
            total += len(item)
            stack.extend(item)
        else:
            stack.extend(getattr(item, "__dict__", {}).values())
            for slot in getattr(type(item), "__slots__", ()):
                stack.append(getattr(item, slot, None))
    return total


@pytest.mark.reliability
async def test_the_rooms_do_not_grow_as_ten_thousand_notices_and_pods_come_and_go() -> None:
    """The notice board once kept when each pod was told, and the drain watch which notices had
    drained, for every pod and notice ever seen: 10,000 spot notices, each with a worker that is
    told, then evicted, grew both by 10,000 entries. Now the store keeps both, and lets go."""
    metrics = Metrics()
    store = Store()
    intake = Intake(
        store, Channels(metrics), metrics, node_name="n1", clock=lambda: T0, wake=lambda: None
    )
    board = NoticeBoard(store, cast(PodList, None), metrics, watches=_Watches(), wake=lambda: None)
    drains = DrainWatch(store, metrics, node_name="n1")
    sizes: dict[int, int] = {}
    for n in range(10_000):
        pod, spot = worker(n), notice(n, "aws/spot")
        store.set_pods([pod])
        intake.observed("aws/spot", [spot])  # the previous notice is withdrawn
        for action in store.due(T0):  # what the reconcile loop does: tell, then write
            if isinstance(action, NotifyPod):
                board.tell(action.pod.uid, action.notice)
            store.record(action, ok=True, now=T0)
        assert await board.acknowledge(pod.key, pod.uid, n) is AckOutcome.ACCEPTED
        store.set_pods([])  # the worker was evicted and left
        drains.check()
        if n in (1_000, 9_999):
            sizes[n] = _entries(store, intake, board, drains)
    assert sizes[9_999] == sizes[1_000]
    # Each worker's notice and acknowledgement were timed, and each drain, once.
    for histogram in ("notify", "time_to_ack", "drain"):
        count = metrics.registry.get_sample_value(f"shoal_agent_{histogram}_seconds_count")
        assert count == 10_000, histogram
