"""PodGroup status as scheduler-plugins' PodGroup controller keeps it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.gang.group_status import GroupStatus, GroupStatuses, group_status, phase_of
from scheduler.model import PodGroup, PodPhase, PodRequest
from tests.unit.scheduler.builders import SCHED, pod

GROUP = PodGroup("ns", "g", 2, uid="u1")


def _pods(*phases: PodPhase) -> list[PodRequest]:
    return [replace(pod(f"p{i}", pod_group="g"), phase=ph) for i, ph in enumerate(phases)]


@pytest.mark.parametrize(
    ("counts", "phase"),
    [
        ((1, 0, 0, 0), "Pending"),  # fewer pods than the minimum
        ((2, 0, 0, 0), "Scheduling"),
        ((3, 1, 0, 0), "Scheduling"),
        ((2, 2, 0, 0), "Running"),
        ((2, 1, 1, 0), "Running"),  # one finished, one still running: still Running
        ((3, 1, 0, 1), "Failed"),
        ((3, 0, 0, 1), "Scheduling"),  # a failure below the minimum is not final yet
        ((2, 0, 2, 0), "Finished"),
        ((3, 0, 2, 1), "Finished"),
    ],
)
def test_phase_from_counts(counts: tuple[int, int, int, int], phase: str) -> None:
    assert phase_of(*counts, minimum=2) == phase


def test_counts_and_start_time_are_written_once_scheduling_begins() -> None:
    assert group_status(GROUP, _pods(PodPhase.PENDING), 5.0) == GroupStatus("Pending")
    found = group_status(GROUP, _pods(PodPhase.RUNNING, PodPhase.SUCCEEDED), 5.0)
    assert found == GroupStatus("Running", running=1, succeeded=1, schedule_start=5.0)
    assert found.body() == {
        "phase": "Running",
        "running": 1,
        "succeeded": 1,
        "failed": 0,
        "scheduleStartTime": "1970-01-01T00:00:05Z",
    }


def test_a_final_phase_is_never_rewritten_and_a_stored_start_never_moves() -> None:
    for final in ("Finished", "Failed"):
        assert group_status(replace(GROUP, phase=final), _pods(PodPhase.PENDING), 5.0) is None
    stored = replace(GROUP, phase="Scheduling", schedule_start=1.0)
    found = group_status(stored, _pods(PodPhase.PENDING, PodPhase.PENDING), 5.0)
    assert found is not None
    assert found.schedule_start == 1.0


def test_a_bad_minimum_gets_no_status() -> None:
    assert group_status(replace(GROUP, min_member="two"), _pods(PodPhase.PENDING), 5.0) is None


def test_the_chosen_start_holds_until_the_group_shows_it() -> None:
    statuses = GroupStatuses(SCHED)
    pods = tuple(_pods(PodPhase.PENDING, PodPhase.PENDING))
    [(_, first)] = statuses.due([(GROUP, pods)], now=10.0)
    changed = tuple(replace(p, phase=PodPhase.RUNNING) for p in pods)
    [(_, second)] = statuses.due([(GROUP, changed)], now=20.0)
    assert first.schedule_start == second.schedule_start == 10.0
    # Deleted and created again under the same name: a new start.
    again = replace(GROUP, uid="u2")
    [(_, third)] = statuses.due([(again, pods)], now=30.0)
    assert third.schedule_start == 30.0


def test_only_pods_that_name_the_group_count() -> None:
    statuses = GroupStatuses(SCHED)
    pods = (*_pods(PodPhase.RUNNING), pod("other", gang="g"), pod("else", pod_group="h"))
    [(_, found)] = statuses.due([(GROUP, pods)], now=1.0)
    assert found == GroupStatus("Pending", running=1)


def test_pods_asked_to_leave_neither_fail_nor_finish_the_group() -> None:
    """A reclaim evicts two of four running members: their containers, stopped by SIGTERM, end
    Failed (or Succeeded) before the objects go. The group stays Running and is written again
    once they are gone, instead of ending Failed, a phase never written again."""
    leaving = [
        replace(p, deleting=True)
        for p in _pods(PodPhase.FAILED, PodPhase.SUCCEEDED, PodPhase.RUNNING)
    ]
    kept = [replace(p, name=f"kept{i}") for i, p in enumerate(_pods(*[PodPhase.RUNNING] * 2))]
    found = group_status(GROUP, [*kept, *leaving], 5.0)
    assert found == GroupStatus("Running", running=3, schedule_start=5.0)
    assert group_status(GROUP, kept, 5.0) == GroupStatus("Running", running=2, schedule_start=5.0)
    # A member that failed on its own still fails the group.
    failed = group_status(GROUP, [*kept, *_pods(PodPhase.FAILED)], 5.0)
    assert failed is not None
    assert failed.phase == "Failed"
