"""Carrying out the store's actions through the :class:`~nodeagent.core.ports.ClusterPort`.

Each action writes to a target (the node, a pod, a cloud event), one write at a time per target,
each in the background on the API threads (:class:`~nodeagent.adapters.calls.ApiCalls`): the
reconcile
loop starts what is due and never waits for it. Per target::

    idle --start--> in flight --done--> idle
                        |
                        +--failed--> held back for retry_after --next start--> idle

Each result goes to the store (:meth:`nodeagent.core.store.Store.record`; a failed action stays
due),
is counted, and wakes the reconcile loop for what follows (an eviction once a pod is told, say).
A withdrawal is told to the pod's watches before its annotation is cleared; the cloud is not
acknowledged on a dry run. A pod the scheduler reclaims (``shoal.dev/reclaimed-for``) keeps the
scheduler's ``shoal.dev/leave-by``: the agent tells its watches but never writes or clears that
annotation, so the scheduler's eviction time stays as the scheduler wrote it. A pod told of a
notice that gives it less time than its checkpoint takes (``shoal.dev/checkpoint-seconds``) gets
a log line and a Warning Event saying so (:func:`nodeagent.core.store.short_notice`). A pod evicted
under a notice that came with less time than the evict margin, or past its deadline
(:class:`~nodeagent.core.events.Late`), gets a log line and a Warning Event saying how late it came.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from datetime import datetime

import structlog

from nodeagent.adapters.calls import ApiCalls
from nodeagent.adapters.metrics import Metrics
from nodeagent.core.events import (
    AckUpstream,
    Action,
    DeletePod,
    EvictPod,
    Late,
    Notice,
    NotifyPod,
    Pod,
    SyncNode,
    WithdrawPod,
    rfc3339,
)
from nodeagent.core.ports import ClusterPort, Provider
from nodeagent.core.store import Store, short_notice
from nodeagent.wiring.board import NoticeBoard

log = structlog.get_logger("nodeagent")

#: The reason of the Event on a pod whose notice is shorter than its checkpoint.
SHORT_NOTICE_REASON = "NoticeShorterThanCheckpoint"
#: The reason of the Event on a pod evicted at once because its notice came too late.
LATE_NOTICE_REASON = "LateNotice"


def target(action: Action) -> str:
    """What an action writes to: one write at a time per node, pod or cloud event."""
    match action:
        case SyncNode():
            return "node"
        case AckUpstream(notice=notice):
            return f"upstream/{notice.event_id}"
        case NotifyPod(pod=pod) | WithdrawPod(pod=pod) | EvictPod(pod=pod) | DeletePod(pod=pod):
            return f"pod/{pod.uid}"


class Executor:
    """Starts the actions the reconcile loop hands it; holds the writes under way."""

    def __init__(
        self,
        store: Store,
        cluster: ClusterPort,
        calls: ApiCalls,
        *,
        board: NoticeBoard,
        providers: Sequence[Provider],
        metrics: Metrics,
        clock: Callable[[], datetime],
        wake: Callable[[], None],
        retry_after: float = 1.0,
        delete_grace_seconds: int = 3,
    ) -> None:
        self._store = store
        self._cluster = cluster
        self._calls = calls
        self._board = board
        self._providers = tuple(providers)
        self._metrics = metrics
        self._clock = clock
        self._wake = wake
        self._retry_after = retry_after
        self._delete_grace = delete_grace_seconds
        #: Writes under way, one per target.
        self._inflight: dict[str, asyncio.Task[None]] = {}
        #: A target whose write failed is not tried again before this (monotonic) time.
        self._retry_at: dict[str, float] = {}

    def start(self, actions: Sequence[Action], now: float) -> None:
        """Start each action whose target is idle at ``now`` (monotonic). A target held back
        whose time has come is let go first: tried now if an action is still due for it,
        forgotten if none is (its pod left, its notice went), so that nothing is held back,
        nor the loop woken, for what is no longer due."""
        for key in [k for k, at in self._retry_at.items() if at <= now]:
            del self._retry_at[key]
        for action in actions:
            key = target(action)
            if key in self._inflight or key in self._retry_at:
                continue
            self._inflight[key] = asyncio.create_task(
                self._carry_out(key, action), name=f"nodeagent-{key}"
            )

    @property
    def pending(self) -> int:
        """Writes under way or waiting to be retried."""
        return len(self._inflight) + len(self._retry_at)

    def next_retry(self) -> float | None:
        """When (monotonic) the first held-back target may be tried again."""
        return min(self._retry_at.values()) if self._retry_at else None

    async def stop(self) -> None:
        """Cancel the writes under way."""
        running = list(self._inflight.values())
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    async def _carry_out(self, key: str, action: Action) -> None:
        try:
            ok = await self._execute(action)
            self._store.record(action, ok=ok, now=self._clock())
            self._metrics.actions.labels(type(action).__name__, "ok" if ok else "failed").inc()
            if not ok:
                self._retry_at[key] = time.monotonic() + self._retry_after
        finally:
            self._inflight.pop(key, None)
            self._wake()

    async def _execute(self, action: Action) -> bool:
        try:
            return await self._write(action)
        except Exception as exc:
            error = str(exc) or type(exc).__name__  # a timeout has no message
            log.warning("action_failed", action=type(action).__name__, error=error)
            return False

    async def _write(self, action: Action) -> bool:
        """Carry out one action; False when the API server refused it (tried again later)."""
        write, cluster = self._calls.write, self._cluster
        match action:
            case SyncNode(notices=notices):
                await write(cluster.sync_node, notices)
                return True
            case NotifyPod(pod=pod, notice=notice):
                await self._notify(pod, notice)
                return True
            case WithdrawPod(pod=pod):
                self._board.withdraw(pod.uid)
                if pod.reclaimed_for is None:
                    await write(cluster.clear_pod, pod)
                return True
            case EvictPod(pod=pod, why=why, late=late):
                evicted = await write(cluster.evict, pod, why)
                if evicted and late is not None:
                    await self._say_late(pod, late)
                return evicted
            case DeletePod(pod=pod):
                return await write(cluster.delete, pod, self._delete_grace)
            case AckUpstream(notice=notice):
                return await self._acknowledge_upstream(notice)

    async def _notify(self, pod: Pod, notice: Notice) -> None:
        """The pod's annotation and Event (not for a reclaim: the scheduler wrote it); and, for a
        notice shorter than the pod's checkpoint, a log line and a Warning Event saying what is
        lost (docs/workers.md, "A notice shorter than the checkpoint")."""
        # The time given counts from when the pod was told (its workers heard it as the loop
        # started this write), not from when the API server took the annotation.
        told = self._clock()
        # False means the pod is gone: nothing left to tell.
        if pod.reclaimed_for is None and not await self._calls.write(
            self._cluster.annotate_pod, pod, notice
        ):
            return
        short = short_notice(pod, notice, told)
        if short is None:
            return
        log.warning(
            "notice_shorter_than_checkpoint",
            pod=pod.key,
            event_id=notice.event_id,
            deadline=rfc3339(notice.deadline),
            given_seconds=short.given,
            checkpoint_seconds=short.needed,
        )
        try:
            await self._calls.write(
                self._cluster.warn_pod, pod, SHORT_NOTICE_REASON, short.message(notice)
            )
        except Exception as exc:  # the pod was told: its notice is not sent again for this
            error = str(exc) or type(exc).__name__
            log.warning("event_not_recorded", reason=SHORT_NOTICE_REASON, error=error)

    async def _say_late(self, pod: Pod, late: Late) -> None:
        """A log line and a Warning Event on a pod evicted at once under a late notice."""
        log.warning(
            "late_notice_evicted",
            pod=pod.key,
            event_id=late.notice.event_id,
            deadline=rfc3339(late.notice.deadline),
            seen=rfc3339(late.seen),
            passed=late.passed,
        )
        try:
            await self._calls.write(self._cluster.warn_pod, pod, LATE_NOTICE_REASON, late.message())
        except Exception as exc:  # the eviction stands: it is not repeated for this
            error = str(exc) or type(exc).__name__
            log.warning("event_not_recorded", reason=LATE_NOTICE_REASON, error=error)

    async def _acknowledge_upstream(self, notice: Notice) -> bool:
        if self._cluster.dry_run:
            log.info("upstream_ack_skipped", event_id=notice.event_id, dry_run=True)
            return True
        for provider in self._providers:
            if provider.name == notice.source:
                await provider.acknowledge(notice)
        return True
