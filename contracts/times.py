"""The one RFC 3339 codec both programs use for the times they write and read under Shoal's
names (``shoal.dev/leave-by``, the ``shoal.dev/revocation`` document, Events, conditions).

Times are written as Kubernetes writes them: UTC, second precision, ``Z``
(``2026-11-30T10:00:00Z``). A time read must carry a zone and lie between :data:`EARLIEST`
and :data:`LATEST`: clouds and the programs write times close to now, so anything else is
garbage, and near the ends of ``datetime``'s range the margin arithmetic would overflow.
"""

from __future__ import annotations

from datetime import UTC, datetime

EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def utc(moment: datetime) -> datetime:
    """``moment`` as an aware UTC datetime (naive values are taken to be UTC)."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def format_time(moment: datetime | float) -> str:
    """``2026-11-30T10:00:00Z`` for a datetime or seconds since the epoch."""
    if not isinstance(moment, datetime):
        moment = datetime.fromtimestamp(moment, UTC)
    return utc(moment).strftime("%Y-%m-%dT%H:%M:%SZ")


def in_range(moment: datetime, text: object) -> datetime:
    """``moment`` when it lies between :data:`EARLIEST` and :data:`LATEST`; else ``ValueError``."""
    if not EARLIEST <= moment < LATEST:
        raise ValueError(f"time out of range ({EARLIEST.year} to {LATEST.year}): {text!r}")
    return moment


def parse_time(text: str) -> datetime:
    """An RFC 3339 / ISO 8601 time with a zone, in range; ``ValueError`` for anything else."""
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"time without a zone: {text!r}")
    try:
        moment = parsed.astimezone(UTC)
    except OverflowError as exc:
        raise ValueError(f"time out of range: {text!r}") from exc
    return in_range(moment, text)


def parse_time_or(text: object, default: float) -> float:
    """Seconds since the epoch for a time :func:`parse_time` accepts, else ``default``: total,
    for fields where a bad value must not stop anything (a leave-by, a creation time)."""
    if not isinstance(text, str) or not text:
        return default
    try:
        return parse_time(text).timestamp()
    except (ValueError, OverflowError, OSError):
        return default
