"""Read health of each metadata channel: what ``/readyz`` and ``/status`` say about metadata.

A channel (``aws/spot``, ``gcp/preempted``, ``gpu``...) is known from its first report on, and
takes its reader's name and ``stale_after`` then. Its state::

    never read --a read--> ok --no read for stale_after--> stale --a read--> ok

Errors are counted in every state. A streak of them is logged when it starts and every 60th
error, and its end when a read succeeds again, so that a dead metadata server fills no log.
Times are passed in: the monotonic ``now`` for ages, the wall clock for what ``/status`` shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import structlog

from nodeagent.adapters.metrics import Metrics
from nodeagent.core.events import rfc3339
from nodeagent.core.ports import Reader

log = structlog.get_logger("nodeagent")

#: An error streak is logged at its first error and then every this many.
LOG_EVERY = 60


@dataclass(frozen=True, slots=True)
class ChannelHealth:
    """One channel's reads (a value: each read or error makes a new one)."""

    provider: str = ""
    stale_after: float = float("inf")
    reads: int = 0
    errors: int = 0
    consecutive_errors: int = 0
    last_ok: float | None = None
    last_ok_wall: datetime | None = None
    last_error: str | None = None
    last_error_kind: str | None = None

    def state(self, now: float) -> str:
        """``ok``, or why not (what ``/readyz`` says of the channel)."""
        if self.last_ok is None:
            return f"never read: {self.last_error}"
        if now - self.last_ok > self.stale_after:
            return f"no read for {now - self.last_ok:.0f} s: {self.last_error}"
        return "ok"

    def report(self, now: float) -> dict[str, Any]:
        return {
            "reads": self.reads,
            "errors": self.errors,
            "consecutive_errors": self.consecutive_errors,
            "last_ok": rfc3339(self.last_ok_wall) if self.last_ok_wall else None,
            "seconds_since_ok": None if self.last_ok is None else round(now - self.last_ok, 3),
            "last_error": self.last_error,
            "last_error_kind": self.last_error_kind,
        }


class Channels:
    """The health of every channel reported so far; counts reads and errors in the metrics."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._health: dict[str, ChannelHealth] = {}

    def _of(self, channel: str, reader: Reader | None) -> ChannelHealth:
        health = self._health.get(channel)
        if health is None:
            health = ChannelHealth()
            if reader is not None:
                health = ChannelHealth(provider=reader.name, stale_after=reader.stale_after())
        return health

    def read(self, channel: str, reader: Reader | None, *, now: float, wall: datetime) -> None:
        """A successful read of ``channel``."""
        before = self._of(channel, reader)
        if before.consecutive_errors:
            log.info("metadata_recovered", channel=channel, after=before.consecutive_errors)
        self._health[channel] = replace(
            before, reads=before.reads + 1, consecutive_errors=0, last_ok=now, last_ok_wall=wall
        )
        self._metrics.metadata_reads.labels(channel).inc()

    def failed(self, channel: str, reader: Reader | None, *, kind: str, error: str) -> None:
        """A failed read of ``channel``: ``kind`` as the provider classed it, ``error`` the
        message."""
        before = self._of(channel, reader)
        health = replace(
            before,
            errors=before.errors + 1,
            consecutive_errors=before.consecutive_errors + 1,
            last_error=error,
            last_error_kind=kind,
        )
        self._health[channel] = health
        self._metrics.metadata_errors.labels(channel, kind).inc()
        streak = health.consecutive_errors
        if streak == 1 or streak % LOG_EVERY == 0:
            log.warning(
                "metadata_error", channel=channel, kind=kind, error=error, consecutive=streak
            )

    def readiness(self, readers: Sequence[str], now: float) -> dict[str, str]:
        """Each channel's state, and each reader with no channel yet (``none`` is disabled)."""
        metadata: dict[str, str] = {}
        for name in readers:
            if name == "none":
                metadata["none"] = "disabled"
            elif not any(h.provider == name for h in self._health.values()):
                metadata[name] = "no read yet"
        for channel, health in self._health.items():
            metadata[channel] = health.state(now)
        return metadata

    def report(self, now: float) -> dict[str, dict[str, Any]]:
        return {name: h.report(now) for name, h in sorted(self._health.items())}
