"""A write the API server refused is held back, then tried again while it is due; once it is
no longer due (its pod left, its notice went) nothing is held back for it, so the reconcile loop
does not wake for it again and ``/status`` counts no write pending."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import cast

import pytest

from nodeagent.adapters.calls import ApiCalls
from nodeagent.adapters.metrics import Metrics
from nodeagent.core.events import EventId, EvictPod, Kind, Notice, Pod, PodKey, PodUid
from nodeagent.core.ports import ClusterPort
from nodeagent.core.store import Store
from nodeagent.wiring.board import NoticeBoard
from nodeagent.wiring.executor import Executor
from tests.waiting import arrives

pytestmark = pytest.mark.reliability

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class _Refusing:
    """An API server that refuses every eviction (a PodDisruptionBudget, say)."""

    dry_run = False

    def __init__(self) -> None:
        self.evictions = 0

    def evict(self, pod: Pod, why: str) -> bool:
        self.evictions += 1
        return False


def _evict(n: int) -> EvictPod:
    pod = Pod(key=PodKey(f"ns/w{n}"), uid=PodUid(f"uid-w{n}"), worker=True)
    notice = Notice(
        event_id=EventId(f"aws-{n}"),
        source="aws",
        channel="aws",
        kind=Kind.TERMINATE,
        deadline=T0 + timedelta(minutes=2),
        reason="spot",
    )
    return EvictPod(pod, notice, "deadline")


async def test_a_refused_write_no_longer_due_is_not_held_back() -> None:
    cluster = _Refusing()
    calls = ApiCalls(timeout=5.0, concurrency=1)
    metrics = Metrics()
    executor = Executor(
        Store(),
        cast(ClusterPort, cluster),
        calls,
        board=cast(NoticeBoard, None),
        providers=[],
        metrics=metrics,
        clock=lambda: T0,
        wake=lambda: None,
        retry_after=1.0,
    )
    try:
        executor.start([_evict(n) for n in range(3)], time.monotonic())
        await arrives(
            lambda: (
                metrics.registry.get_sample_value(
                    "shoal_agent_actions_total", {"action": "EvictPod", "result": "failed"}
                )
                == 3
            ),
            what="three evictions refused",
        )
        # Held back for a second, each: the loop wakes when the first may be tried again.
        assert executor.pending == 3
        assert executor.next_retry() is not None
        # The pods left: nothing is due any more, and nothing is held back for them.
        executor.start([], time.monotonic() + 1.5)
        assert executor.pending == 0
        assert executor.next_retry() is None
        # A write still due when its time comes is tried again, as before.
        executor.start([_evict(9)], time.monotonic())
        await arrives(lambda: cluster.evictions == 4, what="the fourth eviction")
        await arrives(lambda: executor.pending == 1, what="the fourth refusal held back")
        executor.start([_evict(9)], time.monotonic())  # too early: not tried again
        executor.start([_evict(9)], time.monotonic() + 1.5)
        await arrives(lambda: cluster.evictions == 5, what="the eviction tried again")
    finally:
        await executor.stop()
        calls.close()
        await asyncio.sleep(0)
