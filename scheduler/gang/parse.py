"""Parsing of gang sizes from annotations and PodGroup fields: a number or a clear error value."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CountError:
    """Why a member count is not acceptable; ``message`` names the field and the value."""

    message: str


#: Larger gangs than this are refused as a typo rather than waited for forever.
MAX_COUNT = 1_000_000

#: What a count may look like: an optional sign, then ASCII digits (``int()`` alone accepts
#: ``"1_0"`` and other forms, and a check that strips signs let ``"+-1"`` through to raise).
_COUNT = re.compile(r"[+-]?[0-9]+")


def parse_count(raw: object, where: str) -> int | CountError:
    """A member count >= 1 from an int or a decimal string (``" 4 "`` is fine, ``"4.0"`` not).

    Total: any input gives a number or a :class:`CountError`, never an exception.
    """
    if isinstance(raw, bool):
        return CountError(f"{where}: must be a whole number >= 1, got {raw!r}")
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, str):
        text = raw.strip()
        if len(text) > 20 or _COUNT.fullmatch(text) is None:
            return CountError(f"{where}: must be a whole number >= 1, got {raw[:40]!r}")
        value = int(text)
    else:
        return CountError(f"{where}: must be a whole number >= 1, got {raw!r}")
    if value < 1:
        return CountError(f"{where}: must be at least 1, got {value}")
    if value > MAX_COUNT:
        return CountError(f"{where}: must be at most {MAX_COUNT}, got {value}")
    return value


def check_bounds(minimum: int, maximum: int, min_where: str, max_where: str) -> CountError | None:
    if maximum < minimum:
        return CountError(
            f"{max_where} ({maximum}) is smaller than {min_where} ({minimum}); "
            "the maximum must be at least the minimum"
        )
    return None
