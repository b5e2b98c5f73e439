"""The worker distribution reads what the programs write: the same environment names, and the
same leave-by times and checkpoint seconds accepted and refused. ``shoal_worker.contract`` is the
worker's side (it is installed without ``contracts/``); these tests keep the two sides equal."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st
from shoal_worker import contract

from contracts import names, times


def test_the_environment_names_are_the_webhooks_and_the_agents() -> None:
    assert contract.POD_NAMESPACE_ENV == names.POD_NAMESPACE_ENV
    assert contract.POD_NAME_ENV == names.POD_NAME_ENV
    assert contract.POD_UID_ENV == names.POD_UID_ENV
    assert contract.SOCKET_ENV == names.SOCKET_ENV
    assert contract.LEAVE_BY_FILE_ENV == names.LEAVE_BY_FILE_ENV
    assert contract.CHECKPOINT_SECONDS_ENV == names.CHECKPOINT_SECONDS_ENV
    assert contract.MAX_CHECKPOINT_SECONDS == names.MAX_CHECKPOINT_SECONDS


def _same(worker: object, programs: object, text: str) -> None:
    """Both return the same value, or both refuse with ValueError."""

    def outcome(parse: object) -> object:
        assert callable(parse)
        try:
            return parse(text)
        except ValueError:
            return ValueError

    assert outcome(worker) == outcome(programs), text


moments = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9998, 12, 30), timezones=st.just(UTC)
)
zones = st.integers(min_value=-23 * 60, max_value=23 * 60).map(
    lambda m: timezone(timedelta(minutes=m))
)


@given(moments, zones, st.sampled_from(["Z", "z", "offset", "none"]))
def test_times_the_programs_write_or_refuse_are_read_alike(
    moment: datetime, zone: timezone, suffix: str
) -> None:
    local = moment.astimezone(zone) if datetime(1, 1, 3, tzinfo=UTC) < moment else moment
    text = local.replace(tzinfo=None).isoformat()
    text += {"Z": "Z", "z": "z", "offset": local.strftime("%z"), "none": ""}[suffix]
    _same(contract.parse_time, times.parse_time, text)
    _same(contract.parse_time, times.parse_time, times.format_time(moment))


@given(st.text(alphabet="0123456789-:TZz+. ", max_size=30))
def test_any_text_is_a_time_to_both_or_to_neither(text: str) -> None:
    _same(contract.parse_time, times.parse_time, text)


@given(
    st.one_of(
        st.text(alphabet="0123456789.e- ", max_size=12),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.integers(min_value=-10, max_value=10**6).map(str),
    )
)
def test_checkpoint_seconds_are_read_alike(text: str) -> None:
    _same(contract.parse_checkpoint_seconds, names.parse_checkpoint_seconds, text)
