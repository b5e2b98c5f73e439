"""The agent's clock, checked against the API server's and the metadata server's: the I/O.

Every answer of the API server (:class:`nodeagent.adapters.k8s.Cluster`) and of the metadata
server (:class:`nodeagent.adapters.providers.base.Http`) carries a ``Date`` header; how an
offset is estimated from them and when a skew is worth a warning is pure
(:mod:`nodeagent.core.skew`).

:class:`ClockCheck` keeps one estimator per reference (``apiserver``, ``metadata``), fed from the
API threads and the event loop, and is the agent's clock: the local clock plus the API server's
offset (the metadata server's when the API server has not answered yet). The store is told the
corrected ``now``; it never reads a clock. :class:`SkewWatch` publishes the offsets as a gauge
and, beyond ``threshold`` seconds, warns with a log line and a ``ClockSkew`` Event on the node,
at most once per ``every`` seconds unless the offset moves by more than the threshold again.

``SHOAL_TEST_CLOCK_OFFSET`` (:func:`injected_offset`) is a test hook, never for production: seconds
added to the agent's local clock, so the tests can run an agent whose clock is wrong without
``faketime``.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import structlog

from nodeagent.adapters.metrics import Metrics
from nodeagent.core.skew import (
    REFERENCES,
    Estimator,
    Offset,
    Sample,
    SkewWarnings,
    parse_date,
    skew_message,
)

log = structlog.get_logger("nodeagent")

#: The test hook's environment variable (see the module's docstring).
TEST_OFFSET_ENV = "SHOAL_TEST_CLOCK_OFFSET"
#: The reason of the Event on the node whose clock is off.
SKEW_REASON = "ClockSkew"


def injected_offset(environ: dict[str, str] | None = None) -> float:
    """The test hook's offset in seconds (0 when unset). Raises ``ValueError`` for a value that is
    not a finite number."""
    text = (os.environ if environ is None else environ).get(TEST_OFFSET_ENV, "").strip()
    if not text:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"{TEST_OFFSET_ENV}: not a finite number of seconds: {text!r}")
    return value


class ClockCheck:
    """The estimators, fed from any thread (:meth:`probe`), and the corrected clock
    (:meth:`now`) the agent runs on."""

    def __init__(self, local: Callable[[], float] = time.time, *, keep: int = 32) -> None:
        self.local = local
        self._lock = threading.Lock()
        self._estimators = {name: Estimator(keep) for name in REFERENCES}

    def probe(self, reference: str) -> Callable[[float, float, str | None], None]:
        """What an HTTP client calls with each answer (sent, received, its ``Date`` header)."""
        estimator = self._estimators[reference]

        def told(sent: float, received: float, header: str | None) -> None:
            date = parse_date(header)
            if date is not None:
                with self._lock:
                    estimator.add(Sample(sent, received, date))

        return told

    def estimates(self) -> dict[str, Offset]:
        """Each reference's offset, where it answered."""
        with self._lock:
            found = {name: e.offset() for name, e in self._estimators.items()}
        return {name: offset for name, offset in found.items() if offset is not None}

    def offset(self) -> float:
        """What the local clock is corrected by: the first reference that answered."""
        estimates = self.estimates()
        for name in REFERENCES:
            if name in estimates:
                return estimates[name].seconds
        return 0.0

    def timestamp(self) -> float:
        """The corrected clock, seconds since the epoch."""
        return self.local() + self.offset()

    def now(self) -> datetime:
        """The corrected clock: what the agent takes deadlines by."""
        return datetime.fromtimestamp(self.timestamp(), UTC)


class SkewWatch:
    """Every ``interval`` seconds: the offsets into the gauge, and a warning when one is beyond
    ``threshold`` (log line, Event on the node through ``warn_node``, a blocking call)."""

    def __init__(
        self,
        clocks: ClockCheck,
        metrics: Metrics,
        warn_node: Callable[[str, str], None],
        *,
        threshold: float = 5.0,
        every: float = 600.0,
        interval: float = 2.0,
    ) -> None:
        self._clocks = clocks
        self._metrics = metrics
        self._warn_node = warn_node
        self._warnings = SkewWarnings(threshold=threshold, every=every)
        self._interval = interval

    @property
    def threshold(self) -> float:
        return self._warnings.threshold

    async def check(self) -> None:
        for reference, offset in self._clocks.estimates().items():
            self._metrics.clock_offset.labels(reference).set(offset.seconds)
            if not self._warnings.due(reference, offset, time.monotonic()):
                continue
            self._metrics.clock_skew_warnings.labels(reference).inc()
            log.warning(
                "clock_skew",
                reference=reference,
                offset_seconds=round(offset.seconds, 3),
                error_seconds=round(offset.error, 3),
                samples=offset.samples,
                threshold_seconds=self.threshold,
            )
            message = skew_message(reference, offset, self.threshold)
            await asyncio.to_thread(self._warn_node, SKEW_REASON, message)

    async def run(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self._interval)
