"""How far this node's clock is from a reference's, and when that is worth a warning. Pure.

A cloud's deadline is an absolute, real time, and the API server stamps the Events and the
conditions people compare it with; a node whose clock is off would evict too early or too late.
Every answer of the API server and of the metadata server carries a ``Date`` header, whole
seconds of the server's clock. The server read its clock while the request was under way,
between ``sent`` and ``received`` on the local clock, so its offset from the local clock lies
in::

    date - received  <=  offset  <  date + 1 - sent

(the round trip's midpoint is the middle of that interval). The intervals of the recent answers
intersect, each answer narrowing the estimate (:class:`Estimator`); the estimate is the middle
of the intersection. A clock stepped since makes the intervals disjoint: only the answers since
the step count then.

A skew beyond a threshold (the estimate's error counted in the clock's favour) is warned about
at most once per ``every`` seconds, unless the offset moves by more than the threshold again
(:class:`SkewWarnings`, :func:`warning_due`). The I/O (the answers' probes, the corrected clock,
the gauge, the log line and the node's Event) is :mod:`nodeagent.wiring.clock`'s.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC
from email.utils import parsedate_to_datetime

#: The references, most trusted first: the API server stamps what people compare deadlines with.
APISERVER = "apiserver"
METADATA = "metadata"
REFERENCES = (APISERVER, METADATA)


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
    """The offset of one reference's clock, from its most recent ``keep`` answers."""

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


@dataclass(frozen=True, slots=True)
class Warned:
    """The last warning: when (the caller's monotonic clock) and at what offset."""

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


@dataclass(slots=True)
class SkewWarnings:
    """The last warning per reference (one entry per reference at most): :meth:`due` says
    whether ``offset`` is warned about at ``now`` (monotonic), and remembers it when it is."""

    threshold: float = 5.0
    every: float = 600.0
    _warned: dict[str, Warned] = field(default_factory=dict)

    def due(self, reference: str, offset: Offset, now: float) -> bool:
        if not warning_due(offset, self.threshold, self._warned.get(reference), now, self.every):
            return False
        self._warned[reference] = Warned(now, offset.seconds)
        return True


def skew_message(reference: str, offset: Offset, threshold: float) -> str:
    """What the node's Event says."""
    ahead = "behind" if offset.seconds > 0 else "ahead of"
    return (
        f"This node's clock is {abs(offset.seconds):.1f} s (± {offset.error:.1f} s) {ahead} the "
        f"{'API server' if reference == APISERVER else 'metadata server'}'s, more than "
        f"{threshold:g} s: the agent takes deadlines by the corrected clock; check the node's "
        "time synchronisation"
    )
