"""The agent's clock against its references' ``Date`` headers: the offset is estimated from the
round trips, a wrong clock is warned about, and deadlines are taken by the corrected clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from nodeagent.adapters.k8s.cluster import Cluster
from nodeagent.adapters.k8s.transport import Answer
from nodeagent.core.events import EvictPod
from nodeagent.core.skew import (
    APISERVER,
    METADATA,
    Estimator,
    Offset,
    Sample,
    SkewWarnings,
    Warned,
    parse_date,
    skew_message,
    warning_due,
)
from nodeagent.core.store import Store
from nodeagent.wiring.clock import ClockCheck, injected_offset
from tests.unit.nodeagent.test_store import notice, pod, run

pytestmark = pytest.mark.reliability

REAL = datetime(2026, 11, 30, 10, 0, 0, tzinfo=UTC).timestamp()


def date(seconds: float) -> str:
    """The ``Date`` header a server whose clock reads ``seconds`` sends (whole seconds)."""
    return format_datetime(datetime.fromtimestamp(int(seconds), UTC), usegmt=True)


def test_one_answer_puts_the_server_at_the_round_trips_midpoint() -> None:
    estimator = Estimator()
    # Local clock 90 s fast; the request took 0.2 s; the server read 10:00:00.4.
    estimator.add(Sample(sent=REAL + 90.3, received=REAL + 90.5, date=REAL))
    offset = estimator.offset()
    assert offset is not None
    assert offset.low == pytest.approx(-90.5)
    assert offset.high == pytest.approx(-89.3)
    assert offset.seconds == pytest.approx(-89.9)
    assert offset.error == pytest.approx(0.6)


def test_answers_narrow_the_estimate_until_the_clock_steps() -> None:
    estimator = Estimator()
    true_offset = -90.0
    for i in range(20):
        local = REAL + i * 0.37 + 0.05  # answers at different fractions of a second
        server = local + true_offset + 0.01
        estimator.add(Sample(local, local + 0.02, float(int(server))))
    offset = estimator.offset()
    assert offset is not None
    assert offset.samples == 20
    assert abs(offset.seconds - true_offset) < 0.1
    assert offset.error < 0.1
    # The local clock is set right: the older answers disagree and no longer count.
    estimator.add(Sample(REAL + 100.0, REAL + 100.02, REAL + 100.0))
    after = estimator.offset()
    assert after is not None
    assert after.samples == 1
    assert abs(after.seconds) < 1


def test_the_corrected_clock_reads_the_references_time() -> None:
    clocks = ClockCheck(lambda: REAL + 90.0)
    assert clocks.offset() == 0.0  # nobody answered yet
    clocks.probe(METADATA)(REAL + 90.0, REAL + 90.0, date(REAL + 3))
    assert clocks.offset() == pytest.approx(-86.5)  # only the metadata server answered
    clocks.probe(APISERVER)(REAL + 90.0, REAL + 90.0, date(REAL))
    clocks.probe(APISERVER)(REAL + 90.0, REAL + 90.0, None)  # no Date: nothing learnt
    clocks.probe(APISERVER)(REAL + 90.0, REAL + 90.0, "garbage")
    assert clocks.offset() == pytest.approx(-89.5)  # the API server's, first
    assert abs((clocks.now() - datetime.fromtimestamp(REAL, UTC)).total_seconds()) <= 1


def test_deadlines_are_taken_by_the_corrected_clock() -> None:
    """A clock 90 s fast reads a 60 s notice as 30 s overdue; corrected, its pod is evicted at
    the deadline minus the 15 s margin, not before."""
    local = [REAL]
    clocks = ClockCheck(lambda: local[0] + 90.0)
    clocks.probe(APISERVER)(REAL + 90.0, REAL + 90.0, date(REAL))
    t0 = datetime.fromtimestamp(REAL, UTC)
    store = Store()
    store.set_pods([pod("w0")])
    store.observe("aws", [notice(lead=60)], clocks.now())
    run(store, clocks.now())
    assert store.due(clocks.now()) == []
    local[0] = REAL + 44.0
    assert store.due(clocks.now()) == []
    local[0] = REAL + 46.0
    (evict,) = store.due(clocks.now())
    assert isinstance(evict, EvictPod)
    assert evict.late is None
    # Uncorrected, the same clock would have evicted at once, as if the notice were late.
    uncorrected = Store()
    uncorrected.set_pods([pod("w0")])
    uncorrected.observe("aws", [notice(lead=60)], t0 + timedelta(seconds=90))
    run(uncorrected, t0 + timedelta(seconds=90))
    assert [type(a) for a in uncorrected.due(t0 + timedelta(seconds=90))] == [EvictPod]


def test_a_skew_is_warned_about_beyond_the_threshold_and_not_again_soon() -> None:
    skewed = Offset(low=-90.4, high=-89.6, samples=3)
    assert warning_due(skewed, 5.0, None, now=0.0, every=600.0)
    assert not warning_due(Offset(-4.0, -3.0, 2), 5.0, None, now=0.0, every=600.0)
    # Beyond the threshold only with the estimate's error counted in the clock's favour.
    assert not warning_due(Offset(-7.0, -3.5, 1), 5.0, None, now=0.0, every=600.0)
    last = Warned(at=0.0, seconds=-90.0)
    assert not warning_due(skewed, 5.0, last, now=60.0, every=600.0)
    assert warning_due(skewed, 5.0, last, now=600.0, every=600.0)
    assert warning_due(Offset(-200.5, -199.5, 1), 5.0, last, now=60.0, every=600.0)
    message = skew_message(APISERVER, skewed, 5.0)
    assert message.startswith("This node's clock is 90.0 s (± 0.4 s) ahead of the API server's")


def test_each_reference_is_warned_about_once_per_period_unless_it_moves() -> None:
    warnings = SkewWarnings(threshold=5.0, every=600.0)
    skewed = Offset(low=-90.4, high=-89.6, samples=3)
    assert warnings.due(APISERVER, skewed, now=0.0)
    assert not warnings.due(APISERVER, skewed, now=60.0)  # warned a minute ago
    assert warnings.due(METADATA, skewed, now=60.0)  # each reference on its own
    assert warnings.due(APISERVER, Offset(-200.5, -199.5, 1), now=61.0)  # moved by 110 s
    assert not warnings.due(APISERVER, Offset(-200.5, -199.5, 1), now=120.0)
    assert warnings.due(APISERVER, Offset(-200.5, -199.5, 1), now=661.0)
    assert not warnings.due(APISERVER, Offset(-1.0, 1.0, 1), now=5000.0)  # within the threshold


def test_the_test_hook_reads_seconds_or_nothing() -> None:
    assert injected_offset({}) == 0.0
    assert injected_offset({"SHOAL_TEST_CLOCK_OFFSET": "90"}) == 90.0
    with pytest.raises(ValueError, match="not a finite number"):
        injected_offset({"SHOAL_TEST_CLOCK_OFFSET": "nan"})
    assert parse_date("Mon, 30 Nov 2026 10:00:00 GMT") == REAL
    assert parse_date("yesterday") is None


class _Dated:
    """An API server whose every answer is dated ``date``."""

    def __init__(self, date: str) -> None:
        self.date = date

    def request(
        self, method: str, path: str, query: dict[str, str], body: object, content_type: str
    ) -> Answer:
        return Answer(status=200, reason="OK", body=b"{}", date=self.date)


def test_each_api_answer_is_measured_on_the_local_clock() -> None:
    clocks = ClockCheck(lambda: REAL + 90.0)
    cluster = Cluster(
        transport=_Dated(date(REAL)),  # type: ignore[arg-type]
        node_name="n1",
        local=clocks.local,
        on_date=clocks.probe(APISERVER),
    )
    cluster.request("read node", "GET", "/api/v1/nodes/n1")
    assert clocks.estimates()[APISERVER] == Offset(low=-90.0, high=-89.0, samples=1)
