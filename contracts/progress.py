"""The ``shoal.dev/progress`` pod annotation: how much a member would lose if it left now.

The worker library reports its progress to the node agent over the socket (the ``Progress``
call); the agent writes the latest report on the worker's pod, at most once per pod per
:data:`MIN_WRITE_INTERVAL_S`; the scheduler reads it to take, when it must reclaim, the members
whose loss is smallest (docs/architecture.md, "Progress and least-loss reclaim").

Version 1, compact JSON::

    {
      "v": 1,
      "step": 1200,                            # the step the worker is at
      "stepSeconds": 0.8,                      # how long one step takes (recent mean)
      "checkpointStep": 1000,                  # the step of the last COMPLETE checkpoint
      "checkpointAt": "2026-12-02T10:00:00Z",  # when it completed (absent: none yet)
      "checkpointSeconds": 40.0,               # how long a checkpoint takes
      "reportedAt": "2026-12-02T10:02:40Z"     # when the worker reported this
    }

``decode`` rejects anything else with a message naming the field; a reader that cannot use a
document treats the member as one whose progress is unknown (never as one that loses nothing).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Final

from contracts.times import format_time, parse_time

VERSION: Final = 1
#: The agent writes a pod's progress at most this often (the API budget: one write per pod per
#: minute); a report that arrives sooner waits, and only the newest is written.
MIN_WRITE_INTERVAL_S: Final = 60.0
#: A document larger than this is refused before parsing.
MAX_DOCUMENT_BYTES: Final = 1024
#: The largest durations a report may carry (a day); anything larger is garbage.
MAX_SECONDS: Final = 86400.0


class ProgressError(ValueError):
    """The annotation is not a valid progress document; the message names the field."""


@dataclass(frozen=True, slots=True)
class Progress:
    """One worker's latest report; times are seconds since the epoch."""

    step: int
    step_seconds: float
    checkpoint_step: int
    checkpoint_at: float | None
    checkpoint_seconds: float
    reported_at: float

    def steps_at_risk(self) -> int:
        """Steps done since the last complete checkpoint (what leaving now would lose)."""
        return max(0, self.step - self.checkpoint_step)

    def seconds_at_risk(self, now: float) -> float:
        """Seconds of work since the last complete checkpoint, as of ``now``.

        The steps since the checkpoint at the reported step time, plus the time since the
        report (the worker kept training); without a checkpoint, everything since the report
        of step 0 (estimated from the steps done)."""
        since_report = max(0.0, now - self.reported_at)
        return self.steps_at_risk() * self.step_seconds + since_report


def encode(progress: Progress) -> str:
    """The annotation value (compact JSON, stable key order)."""
    document: dict[str, Any] = {
        "v": VERSION,
        "step": progress.step,
        "stepSeconds": round(progress.step_seconds, 3),
        "checkpointStep": progress.checkpoint_step,
        "checkpointSeconds": round(progress.checkpoint_seconds, 3),
        "reportedAt": format_time(progress.reported_at),
    }
    if progress.checkpoint_at is not None:
        document["checkpointAt"] = format_time(progress.checkpoint_at)
    return json.dumps(document, separators=(",", ":"), sort_keys=True)


def _count(document: dict[str, Any], key: str) -> int:
    value = document.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProgressError(f"{key}: want a whole number >= 0, got {value!r}")
    return value


def _seconds(document: dict[str, Any], key: str) -> float:
    value = document.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProgressError(f"{key}: want seconds, got {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or not 0.0 <= seconds <= MAX_SECONDS:
        raise ProgressError(f"{key}: want 0 to {MAX_SECONDS:g} seconds, got {value!r}")
    return seconds


def _optional_time(document: dict[str, Any], key: str) -> float | None:
    return None if document.get(key) is None else _time(document, key)


def _time(document: dict[str, Any], key: str) -> float:
    value = document.get(key)
    if not isinstance(value, str):
        raise ProgressError(f"{key}: want an RFC 3339 time, got {value!r}")
    try:
        return parse_time(value).timestamp()
    except ValueError as exc:
        raise ProgressError(f"{key}: {exc}") from exc


def decode(text: str) -> Progress:
    """Parse and validate an annotation value; raises :class:`ProgressError` naming the field."""
    if len(text.encode()) > MAX_DOCUMENT_BYTES:
        raise ProgressError(f"document larger than {MAX_DOCUMENT_BYTES} bytes")
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ProgressError(f"not JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise ProgressError("want a JSON object")
    if document.get("v") != VERSION:
        raise ProgressError(f"v: want {VERSION}, got {document.get('v')!r}")
    step = _count(document, "step")
    checkpoint_step = _count(document, "checkpointStep")
    if checkpoint_step > step:
        raise ProgressError(f"checkpointStep: {checkpoint_step} is past step {step}")
    return Progress(
        step=step,
        step_seconds=_seconds(document, "stepSeconds"),
        checkpoint_step=checkpoint_step,
        checkpoint_at=_optional_time(document, "checkpointAt"),
        checkpoint_seconds=_seconds(document, "checkpointSeconds"),
        reported_at=_time(document, "reportedAt"),
    )


def decode_or_none(text: object) -> Progress | None:
    """:func:`decode` for readers that must not stop on a bad document: ``None`` instead."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return decode(text)
    except ProgressError:
        return None
