"""The one time codec: what is written reads back; what cannot be read is an error or the
default, never anything else."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.times import format_time, parse_time, parse_time_or


@given(st.integers(min_value=0, max_value=200 * 365 * 24 * 3600))
def test_a_written_time_reads_back_to_the_second(seconds: int) -> None:
    text = format_time(float(seconds))
    assert text.endswith("Z")
    assert parse_time(text).timestamp() == seconds
    assert format_time(datetime.fromtimestamp(seconds, UTC)) == text


def test_zones_are_honoured_and_a_missing_zone_is_refused() -> None:
    east = datetime(2026, 11, 30, 11, 0, tzinfo=timezone(timedelta(hours=1)))
    assert parse_time(east.isoformat()) == datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    with pytest.raises(ValueError, match="without a zone"):
        parse_time("2026-11-30T10:00:00")
    with pytest.raises(ValueError, match="out of range"):
        parse_time("9999-12-31T23:59:59Z")


@given(st.one_of(st.text(max_size=40), st.none(), st.integers(), st.floats()))
def test_parse_time_or_is_total(text: object) -> None:
    assert isinstance(parse_time_or(text, 7.0), float)
