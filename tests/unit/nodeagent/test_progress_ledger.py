"""The agent's pacing of progress writes (nodeagent/core/progress.py): the first report of a pod
is written at once, later ones at most once per pod per interval and only the newest, a failed
write spends no extra request, and pods that leave are forgotten."""

from __future__ import annotations

import itertools

from contracts.progress import MIN_WRITE_INTERVAL_S, Progress
from nodeagent.core.events import PodKey, PodUid
from nodeagent.core.progress import ProgressLedger

A = (PodKey("train/worker-0"), PodUid("uid-0"))
B = (PodKey("train/worker-1"), PodUid("uid-1"))


def report(step: int, at: float = 1_800_000_000.0) -> Progress:
    return Progress(
        step=step,
        step_seconds=0.5,
        checkpoint_step=step // 100 * 100,
        checkpoint_at=at - 30,
        checkpoint_seconds=12.0,
        reported_at=at,
    )


def writes(ledger: ProgressLedger, now: float) -> list[tuple[str, int]]:
    """Start what is due at ``now`` and finish each write at once."""
    due = ledger.due(now)
    for d in due:
        ledger.written(d.uid)
    return [(d.key, d.progress.step) for d in due]


def test_the_interval_is_the_contracts_one_write_per_pod_per_minute() -> None:
    assert ProgressLedger().interval == MIN_WRITE_INTERVAL_S == 60.0


def test_the_first_report_of_a_pod_is_written_at_once() -> None:
    ledger = ProgressLedger()
    ledger.offer(*A, report(10))
    assert ledger.next_due(100.0) == 0.0
    assert writes(ledger, 100.0) == [("train/worker-0", 10)]
    assert ledger.next_due(100.0) is None


def test_a_burst_within_the_interval_is_one_later_write_of_the_newest_report() -> None:
    ledger = ProgressLedger()
    ledger.offer(*A, report(10))
    assert writes(ledger, 100.0) == [("train/worker-0", 10)]
    for step, now in ((11, 101.0), (12, 105.0), (13, 140.0)):
        ledger.offer(*A, report(step))
        assert writes(ledger, now) == []
    assert ledger.next_due(140.0) == 20.0
    assert writes(ledger, 159.9) == []
    assert writes(ledger, 160.0) == [("train/worker-0", 13)]
    # Nothing new: nothing more, however long it waits.
    assert writes(ledger, 1000.0) == []
    assert ledger.next_due(1000.0) is None


def test_a_steady_reporter_gets_one_write_per_interval() -> None:
    ledger = ProgressLedger()
    written: list[float] = []
    now = 0.0
    while now < 600.0:  # a report every 5 s for ten minutes
        ledger.offer(*A, report(int(now)))
        if writes(ledger, now):
            written.append(now)
        now += 5.0
    assert len(written) == 10
    assert all(b - a >= MIN_WRITE_INTERVAL_S for a, b in itertools.pairwise(written))


def test_pods_are_paced_each_on_their_own() -> None:
    ledger = ProgressLedger()
    ledger.offer(*A, report(1))
    assert writes(ledger, 0.0) == [("train/worker-0", 1)]
    ledger.offer(*A, report(2))
    ledger.offer(*B, report(7))
    assert writes(ledger, 1.0) == [("train/worker-1", 7)]


def test_a_report_during_a_write_waits_for_the_interval_after_it() -> None:
    ledger = ProgressLedger()
    ledger.offer(*A, report(1))
    [first] = ledger.due(0.0)
    ledger.offer(*A, report(2))
    assert ledger.due(61.0) == []  # the first write is still under way
    ledger.written(first.uid)
    assert [d.progress.step for d in ledger.due(61.0)] == [2]


def test_a_failed_write_keeps_the_newest_report_for_the_next_turn_and_sends_no_extra() -> None:
    ledger = ProgressLedger()
    ledger.offer(*A, report(1))
    [first] = ledger.due(0.0)
    ledger.failed(first)
    assert ledger.waiting(A[1]) == report(1)
    assert ledger.due(30.0) == []  # an API server that fails gets no more than the budget
    ledger.offer(*A, report(5))
    [again] = ledger.due(60.0)
    assert again.progress.step == 5


def test_pods_that_leave_are_forgotten() -> None:
    ledger = ProgressLedger()
    ledger.offer(*A, report(1))
    ledger.offer(*B, report(2))
    assert ledger.keep_only({B[1]}) == [A[1]]
    assert len(ledger) == 1
    ledger.forget(B[1])
    assert len(ledger) == 0
    assert ledger.due(0.0) == []
    ledger.written(A[1])  # a write that ends after its pod left changes nothing
    assert len(ledger) == 0
