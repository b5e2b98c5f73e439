"""Progress reports: how far a worker is, and its last complete checkpoint (the ``Progress``
call of protocol 0.2.0).

The agent writes the newest report on the pod (``shoal.dev/progress``) at most once a minute;
when it must take GPUs back, the scheduler reclaims the members that would lose the least. A
worker reports as often as it likes through :class:`ProgressReporter`: reports are paced on the
worker's side too (at most one message every :data:`MIN_INTERVAL_S` seconds, the newest one;
the first at once), sent from a background thread, and never block the training loop::

    reporter = ProgressReporter(NoticeClient.from_env())
    for step in range(start, total):
        train_one_step(step)
        reporter.report(step, step_seconds=mean_step, checkpoint_step=last_saved,
                        checkpoint_at=saved_at, checkpoint_seconds=save_takes)

An agent older than 0.2.0 answers ``UNIMPLEMENTED``: the reporter logs that once and sends
nothing more. :class:`Pacer` is the pacing itself, pure (``now`` is passed in).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from shoal_worker.protocol import notices_pb2 as pb

if TYPE_CHECKING:
    from shoal_worker.watcher import NoticeClient

log = logging.getLogger(__name__)

#: A worker sends at most one report this often (seconds); the agent writes at most one a
#: minute, so sending more often only keeps the newest values fresher.
MIN_INTERVAL_S: Final = 5.0
#: The longest duration a report may carry (a day), as the agent accepts it.
MAX_SECONDS: Final = 86400.0


@dataclass(frozen=True, slots=True)
class Report:
    """One progress report. ``checkpoint_step`` is the step of the last *complete* checkpoint
    (0 with none yet); ``checkpoint_at`` when it completed (seconds since the epoch; None: no
    checkpoint yet); durations in seconds (0: not known)."""

    step: int
    step_seconds: float = 0.0
    checkpoint_step: int = 0
    checkpoint_at: float | None = None
    checkpoint_seconds: float = 0.0

    def problem(self) -> str | None:
        """What is wrong with the report (naming the field), or None; the agent refuses the
        same."""
        if self.step < 0:
            return f"step: want a whole number >= 0, got {self.step}"
        if not 0 <= self.checkpoint_step <= self.step:
            return f"checkpoint_step: want 0 to step ({self.step}), got {self.checkpoint_step}"
        for name in ("step_seconds", "checkpoint_seconds"):
            value = getattr(self, name)
            if not math.isfinite(value) or not 0.0 <= value <= MAX_SECONDS:
                return f"{name}: want 0 to {MAX_SECONDS:g} seconds, got {value!r}"
        if self.checkpoint_at is not None and not (
            math.isfinite(self.checkpoint_at) and self.checkpoint_at > 0
        ):
            return f"checkpoint_at: want seconds since the epoch, got {self.checkpoint_at!r}"
        return None


def request(pod: pb.PodIdentity, report: Report) -> pb.ProgressRequest:
    """The ``ProgressRequest`` for ``report`` (the wire codec; the agent's side is
    ``nodeagent.notify.server.progress_of``)."""
    at = report.checkpoint_at
    return pb.ProgressRequest(
        pod=pod,
        step=report.step,
        step_seconds=report.step_seconds,
        checkpoint_step=report.checkpoint_step,
        checkpoint_unix_ms=0 if at is None else round(at * 1000),
        checkpoint_seconds=report.checkpoint_seconds,
    )


class Pacer:
    """At most one report per ``interval`` seconds, the newest; pure (``now``: monotonic
    seconds, passed in)::

        idle --offer--> sent (returned at once)
        sent --offer within interval--> held (replaces any held report)
        held --take at or after sent + interval--> sent (the held report returned)
    """

    def __init__(self, interval: float = MIN_INTERVAL_S) -> None:
        self.interval = interval
        self._sent_at: float | None = None
        self._held: Report | None = None

    def offer(self, report: Report, now: float) -> Report | None:
        """``report`` when it may be sent now (and counts as sent), else None (held)."""
        if self._sent_at is None or now - self._sent_at >= self.interval:
            self._sent_at = now
            self._held = None
            return report
        self._held = report
        return None

    def due_in(self, now: float) -> float | None:
        """Seconds until the held report may be sent (0: now); None when none is held."""
        if self._held is None:
            return None
        assert self._sent_at is not None
        return max(0.0, self._sent_at + self.interval - now)

    def take(self, now: float) -> Report | None:
        """The held report when it is due (and counts as sent), else None."""
        due = self.due_in(now)
        if due is None or due > 0:
            return None
        held, self._held = self._held, None
        self._sent_at = now
        return held


class StepTimer:
    """The recent mean step time, from the times steps end; pure (``now``: monotonic seconds).

    An exponentially weighted mean (``weight`` for the newest step), so that a slower phase
    shows within a few dozen steps; steps skipped between two calls count evenly."""

    def __init__(self, weight: float = 0.1) -> None:
        self.weight = weight
        self.mean: float | None = None
        self._last: tuple[int, float] | None = None

    def stepped(self, step: int, now: float) -> float | None:
        """``step`` ended at ``now``; returns the mean (None until two steps ended)."""
        last = self._last
        self._last = (step, now)
        if last is None or step <= last[0]:
            return self.mean
        took = max(0.0, now - last[1]) / (step - last[0])
        self.mean = took if self.mean is None else self.mean + self.weight * (took - self.mean)
        return self.mean

    def paused(self, seconds: float) -> None:
        """``seconds`` since the last step were not training (a checkpoint): not counted."""
        if self._last is not None:
            self._last = (self._last[0], self._last[1] + seconds)


class ProgressReporter:
    """Sends reports through ``client`` from a background thread, paced by a :class:`Pacer`.

    :meth:`report` never blocks and never raises: a report that cannot be sent (the agent is
    away, restarting) is logged at debug level and the next one goes out in its turn. Once the
    agent answers that it does not know the call, nothing more is sent.
    """

    def __init__(self, client: NoticeClient, interval: float = MIN_INTERVAL_S) -> None:
        self.client = client
        self._pacer = Pacer(interval)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._pending: Report | None = None
        #: Reports the agent took, and whether it knows the call (False: older than 0.2.0).
        self.sent = 0
        self.supported = True

    def report(
        self,
        step: int,
        *,
        step_seconds: float = 0.0,
        checkpoint_step: int = 0,
        checkpoint_at: float | None = None,
        checkpoint_seconds: float = 0.0,
    ) -> None:
        """The worker is at ``step``; its last complete checkpoint is ``checkpoint_step``
        (completed at ``checkpoint_at``, seconds since the epoch; None: none yet)."""
        self.offer(
            Report(step, step_seconds, checkpoint_step, checkpoint_at, checkpoint_seconds),
            time.monotonic(),
        )

    def offer(self, report: Report, now: float) -> None:
        if not self.supported or self._closed.is_set():
            return
        problem = report.problem()
        if problem is not None:
            log.warning("progress report not sent: %s", problem)
            return
        with self._lock:
            ready = self._pacer.offer(report, now)
            if ready is not None:
                self._pending = ready
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="shoal-progress", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def close(self, timeout: float = 2.0) -> None:
        """Stop the thread (a report being sent gets ``timeout`` seconds)."""
        self._closed.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _next(self) -> tuple[Report | None, float | None]:
        with self._lock:
            now = time.monotonic()
            ready, self._pending = self._pending, None
            if ready is None:
                ready = self._pacer.take(now)
            return ready, self._pacer.due_in(now)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            while not self._closed.is_set() and self.supported:
                ready, due_in = self._next()
                if ready is not None:
                    loop.run_until_complete(self._send(ready))
                    continue
                self._wake.wait(due_in)
                self._wake.clear()
        finally:
            loop.close()

    async def _send(self, report: Report) -> None:
        try:
            known = await self.client.report_progress(report)
        except Exception as exc:  # refused, or the agent away or restarting: the next goes later
            log.debug("progress report not sent: %s", exc)
            return
        if known:
            self.sent += 1
        else:
            self.supported = False


__all__ = ["MIN_INTERVAL_S", "Pacer", "ProgressReporter", "Report", "StepTimer", "request"]
