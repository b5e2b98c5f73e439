"""The workers' progress, written on their pods within the API budget.

The notice socket's service hands each report from a pod it identified to
:class:`ProgressWriter` (a :class:`~nodeagent.core.progress.ProgressSink`), which only records
it and returns: the notice path never waits on a write. A guarded task writes what the pure
:class:`~nodeagent.core.progress.ProgressLedger` says is due: the pod's newest report as its
``shoal.dev/progress`` annotation (:mod:`contracts.progress`), the first one at once and then
at most once per pod per :data:`contracts.progress.MIN_WRITE_INTERVAL_S` seconds, however often
the workers report. Writes run on an API thread of their own (:class:`ApiCalls` with one
thread), so a slow API server delays progress, never a notice, an eviction or an
acknowledgement. Pods that leave the node are forgotten.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Final

import structlog

from contracts.progress import MIN_WRITE_INTERVAL_S, Progress, encode
from nodeagent.adapters.calls import ApiCalls
from nodeagent.adapters.metrics import Metrics
from nodeagent.core.events import PodKey, PodUid
from nodeagent.core.ports import ClusterPort
from nodeagent.core.progress import Due, ProgressLedger
from nodeagent.core.store import Store

log = structlog.get_logger("nodeagent")

#: Seconds between checks for pods that left the node (their reports are dropped).
PRUNE_EVERY: Final = 5.0
#: A streak of failed writes is logged at its first failure and then every this many.
LOG_EVERY: Final = 60


class ProgressWriter:
    """Satisfies :class:`nodeagent.core.progress.ProgressSink`; :meth:`run` writes."""

    def __init__(
        self,
        store: Store,
        cluster: ClusterPort,
        calls: ApiCalls,
        metrics: Metrics,
        *,
        interval: float = MIN_WRITE_INTERVAL_S,
    ) -> None:
        self._store = store
        self._cluster = cluster
        self._calls = calls
        self._metrics = metrics
        self.ledger = ProgressLedger(interval)
        self._wake = asyncio.Event()
        self._writes: set[asyncio.Task[None]] = set()
        self._pruned_at = 0.0
        self._failures = 0

    # --- what the notice socket's service hands over ---------------------------------------------

    def report(self, key: PodKey, uid: PodUid, progress: Progress) -> None:
        self.ledger.offer(key, uid, progress)
        self._metrics.progress_reports.inc()
        self._wake.set()

    # --- the writing task ------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            while True:
                self._wake.clear()
                now = time.monotonic()
                if now - self._pruned_at >= PRUNE_EVERY:
                    self._prune(now)
                for due in self.ledger.due(now):
                    task = asyncio.create_task(self._write(due), name=f"progress-{due.key}")
                    self._writes.add(task)
                    task.add_done_callback(self._writes.discard)
                wait = self.ledger.next_due(time.monotonic())
                timeout = PRUNE_EVERY if wait is None else min(wait, PRUNE_EVERY)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
        finally:
            for task in self._writes:
                task.cancel()

    def _prune(self, now: float) -> None:
        self._pruned_at = now
        for uid in self.ledger.keep_only({pod.uid for pod in self._store.pods()}):
            log.debug("progress_forgotten", uid=uid)

    async def _write(self, due: Due) -> None:
        pod = self._store.pod(due.uid)
        if pod is None:
            self.ledger.forget(due.uid)
            self._metrics.progress_writes.labels("gone").inc()
            return
        try:
            written = await self._calls.write(
                self._cluster.annotate_progress, pod, encode(due.progress)
            )
        except Exception as exc:  # the API server: the newest report goes at the next turn
            self.ledger.failed(due)
            self._metrics.progress_writes.labels("failed").inc()
            self._failures += 1
            if self._failures == 1 or self._failures % LOG_EVERY == 0:
                log.warning(
                    "progress_write_failed",
                    pod=due.key,
                    error=str(exc) or type(exc).__name__,
                    failures=self._failures,
                )
            self._wake.set()
            return
        self._failures = 0
        self.ledger.written(due.uid)
        if not written:
            self.ledger.forget(due.uid)
        self._metrics.progress_writes.labels("written" if written else "gone").inc()
        self._wake.set()
