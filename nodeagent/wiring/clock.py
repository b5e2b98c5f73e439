"""The agent's clock, checked against the API server's and the metadata server's.

A cloud's deadline is an absolute, real time, and the API server stamps the Events and the
conditions people compare it with; a node whose clock is off would evict too early or too late.
Every answer of the API server (:class:`nodeagent.adapters.k8s.Cluster`) and of the metadata server
(:class:`nodeagent.adapters.providers.base.Http`) carries a ``Date`` header, whole seconds of the
server's clock. The server read its clock while the request was under way, between ``sent`` and
``received`` on the local clock, so its offset from the local clock lies in::

    date - received  <=  offset  <  date + 1 - sent

(the round trip's midpoint is the middle of that interval). The intervals of the recent answers
intersect, each answer narrowing the estimate (:class:`Estimator`, pure); the estimate is the
middle of the intersection. A clock stepped since makes the intervals disjoint: only the answers
since the step count then.

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
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import structlog

from nodeagent.adapters.metrics import Metrics

log = structlog.get_logger("nodeagent")

#: The references, most trusted first: the API server stamps what people compare deadlines with.
APISERVER = "apiserver"
METADATA = "metadata"
REFERENCES = (APISERVER, METADATA)
#: The test hook's environment variable (see the module's docstring).
TEST_OFFSET_ENV = "SHOAL_TEST_CLOCK_OFFSET"
#: The reason of the Event on the node whose clock is off.
SKEW_REASON = "ClockSkew"


@dataclass(frozen=True, slots=True)
class Sample:
    """One answer: sent and received on the local clock, the server's ``Date`` (all seconds
    since the epoch; ``date`` whole seconds)."""

    sent: float
    received: float
    date: float

    @property
    def low(self) -> float:
        return self.date - self.received

    @property
    def high(self) -> float:
        return self.date + 1.0 - self.sent


@dataclass(frozen=True, slots=True)
class Offset:
    """The reference's clock minus the local clock lies in ``[low, high]`` seconds, by
    ``samples`` answers."""

    low: float
    high: float
    samples: int

    @property
    def seconds(self) -> float:
        """The estimate: the middle of the interval."""
        return (self.low + self.high) / 2

    @property
    def error(self) -> float:
        """How far the true offset may be from :attr:`seconds`."""
        return (self.high - self.low) / 2


def parse_date(header: str | None) -> float | None:
    """An HTTP ``Date`` header as seconds since the epoch; None when absent or unreadable."""
    if not header:
        return None
    try:
        moment = parsedate_to_datetime(header)
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


@dataclass(slots=True)
class Estimator:
    """The offset of one reference's clock, from its most recent ``keep`` answers. Pure."""

    keep: int = 32
    _samples: deque[Sample] = field(default_factory=deque)

    def add(self, sample: Sample) -> None:
        if sample.received < sample.sent:  # the local clock stepped back mid-request
            return
        self._samples.append(sample)
        while len(self._samples) > self.keep:
            self._samples.popleft()

    def offset(self) -> Offset | None:
        """The intersection of the newest answers' intervals, going back until an older one
        disagrees (the local clock or the server's stepped in between)."""
        low, high, count = -math.inf, math.inf, 0
        for sample in reversed(self._samples):
            lo, hi = max(low, sample.low), min(high, sample.high)
            if lo > hi:
                break
            low, high, count = lo, hi, count + 1
        return None if count == 0 else Offset(low, high, count)


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


@dataclass(frozen=True, slots=True)
class Warned:
    """The last warning: when (monotonic) and at what offset."""

    at: float
    seconds: float


def warning_due(
    offset: Offset, threshold: float, last: Warned | None, now: float, every: float
) -> bool:
    """Whether a skew of ``offset`` is worth a warning at ``now`` (monotonic): beyond
    ``threshold`` with the estimate's error counted in its favour, and either not warned
    within ``every`` seconds or moved by more than ``threshold`` since the last warning."""
    if abs(offset.seconds) - offset.error <= threshold:
        return False
    if last is None or now - last.at >= every:
        return True
    return abs(offset.seconds - last.seconds) > threshold


def skew_message(reference: str, offset: Offset, threshold: float) -> str:
    """What the node's Event says."""
    ahead = "behind" if offset.seconds > 0 else "ahead of"
    return (
        f"This node's clock is {abs(offset.seconds):.1f} s (± {offset.error:.1f} s) {ahead} the "
        f"{'API server' if reference == APISERVER else 'metadata server'}'s, more than "
        f"{threshold:g} s: the agent takes deadlines by the corrected clock; check the node's "
        "time synchronisation"
    )


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
        self.threshold = threshold
        self._every = every
        self._interval = interval
        self._warned: dict[str, Warned] = {}

    async def check(self) -> None:
        for reference, offset in self._clocks.estimates().items():
            self._metrics.clock_offset.labels(reference).set(offset.seconds)
            now = time.monotonic()
            if not warning_due(
                offset, self.threshold, self._warned.get(reference), now, self._every
            ):
                continue
            self._warned[reference] = Warned(now, offset.seconds)
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
