"""The ``status`` of a scheduler-plugins PodGroup, kept the way that project's own PodGroup
controller keeps it, so that its users (and the Kubeflow training-operator, which reads it) see
what they expect. Pure.

Computed from the PodGroup and every pod that names it (label ``scheduling.x-k8s.io/pod-group``),
finished ones included, for each kind whose status comes from its members
(:attr:`~scheduler.gang.kinds.base.PodGroupKind.status_from_members`):

* ``running``, ``succeeded``, ``failed``: how many of those pods are in that phase. A pod being
  deleted counts as running while it runs, but never as succeeded or failed: it ended because it
  was asked to leave (reclaimed, shrunk, drained before a spot revocation, deleted by its
  controller), and the phase it ends in (an evicted container stopped by SIGTERM ends
  ``Failed``) says nothing about the group. Counted, it would make the group ``Failed`` (or
  ``Finished``), phases that are never written again, at every reclaim;
* ``phase``: ``Pending`` while fewer pods than ``spec.minMember`` exist; ``Scheduling`` once they
  do, until ``running + succeeded`` reaches the minimum: then ``Running``; ``Failed`` once a pod
  failed and ``failed + running + succeeded`` reaches the minimum; ``Finished`` once
  ``succeeded`` does. ``Failed`` and ``Finished`` are final: a PodGroup that says either is
  never written again;
* ``scheduleStartTime``: when the phase first left ``Pending`` (the group had its minimum of
  pods and scheduling began); set once, never moved.

Nothing else is written: the PodGroup's schema has no other status field.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from contracts.times import format_time
from scheduler.gang.kinds import KINDS, Kinds, StatusPatch
from scheduler.gang.parse import CountError, parse_count
from scheduler.model import PodGroup, PodPhase, PodRequest

PENDING = "Pending"
SCHEDULING = "Scheduling"
RUNNING = "Running"
FAILED = "Failed"
FINISHED = "Finished"
FINAL = frozenset({FAILED, FINISHED})


@dataclass(frozen=True, slots=True)
class GroupStatus:
    phase: str
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    #: Seconds since the epoch; ``None`` while the group is still ``Pending``.
    schedule_start: float | None = None

    def body(self) -> dict[str, Any]:
        """The ``status`` object as the API stores it."""
        body: dict[str, Any] = {
            "phase": self.phase,
            "running": self.running,
            "succeeded": self.succeeded,
            "failed": self.failed,
        }
        if self.schedule_start is not None:
            body["scheduleStartTime"] = format_time(self.schedule_start)
        return body

    def write(self, group: PodGroup) -> StatusPatch:
        """The write that gives ``group`` this status: on that very object only."""
        return StatusPatch(self.body(), uid=group.uid)


def phase_of(count: int, running: int, succeeded: int, failed: int, minimum: int) -> str:
    """The phase for ``count`` pods, of which so many run, succeeded and failed."""
    if count < minimum:
        return PENDING
    if succeeded >= minimum:
        return FINISHED
    if failed and failed + running + succeeded >= minimum:
        return FAILED
    if running + succeeded >= minimum:
        return RUNNING
    return SCHEDULING


def group_status(
    group: PodGroup, pods: Sequence[PodRequest], started: float | None
) -> GroupStatus | None:
    """The status ``group`` should have with ``pods``; ``None`` when it must not be written (its
    phase is final, or ``spec.minMember`` is not a count: that is reported to its members).
    ``started`` is the ``scheduleStartTime`` to give it when scheduling has begun."""
    if group.phase in FINAL:
        return None
    minimum = parse_count(group.min_member, "spec.minMember")
    if isinstance(minimum, CountError):
        return None
    running = sum(1 for p in pods if p.phase == PodPhase.RUNNING)
    ended = [p.phase for p in pods if not p.deleting]  # see the module's docstring
    succeeded = sum(1 for phase in ended if phase == PodPhase.SUCCEEDED)
    failed = sum(1 for phase in ended if phase == PodPhase.FAILED)
    phase = phase_of(len(pods), running, succeeded, failed, minimum)
    start = group.schedule_start
    if start is None and phase != PENDING:
        start = started
    return GroupStatus(phase, running, succeeded, failed, start)


class GroupStatuses:
    """The status every PodGroup of one scheduler should have, recomputed only for groups whose
    pods or object changed; remembers the ``scheduleStartTime`` it chose for a group until the
    PodGroup shows it, so that the time never moves between two writes."""

    def __init__(self, scheduler_name: str, kinds: Kinds = KINDS) -> None:
        self._name = scheduler_name
        self._kinds = kinds
        self._memo: dict[str, tuple[Sequence[PodRequest], PodGroup, GroupStatus | None]] = {}
        #: ``namespace/name`` -> (uid, start chosen) for groups not yet showing their start.
        self._started: dict[str, tuple[str, float]] = {}

    def due(
        self, groups: Iterable[tuple[PodGroup, Sequence[PodRequest]]], now: float
    ) -> list[tuple[PodGroup, GroupStatus]]:
        """Each of ``groups`` that one of this scheduler's pods names, with the status it should
        have. Each group comes with the pods that may name it (a superset is fine; the same
        sequence object from one call to the next while none of them changed)."""
        memo: dict[str, tuple[Sequence[PodRequest], PodGroup, GroupStatus | None]] = {}
        found: list[tuple[PodGroup, GroupStatus]] = []
        for group, pods in groups:
            ref = group.ref
            old = self._memo.get(ref)
            if old is not None and old[0] is pods and old[1] is group:
                status = old[2]
            else:
                status = self._one(ref, group, pods, now)
            memo[ref] = (pods, group, status)
            if status is not None:
                found.append((group, status))
        self._memo = memo
        self._started = {k: v for k, v in self._started.items() if k in memo}
        return found

    def _one(
        self, ref: str, group: PodGroup, pods: Sequence[PodRequest], now: float
    ) -> GroupStatus | None:
        pods = members_of(group, pods, self._kinds)
        if not any(p.scheduler_name == self._name for p in pods):
            return None
        chosen = self._started.get(ref)
        started = chosen[1] if chosen is not None and chosen[0] == group.uid else now
        status = group_status(group, pods, started)
        if status is None or group.schedule_start is not None:
            self._started.pop(ref, None)
        elif status.schedule_start is not None:
            self._started[ref] = (group.uid, status.schedule_start)
        return status


def members_of(
    group: PodGroup, pods: Iterable[PodRequest], kinds: Kinds = KINDS
) -> tuple[PodRequest, ...]:
    """The pods in ``group``'s namespace that name it."""
    kind = kinds.of(group)
    return tuple(p for p in pods if p.namespace == group.namespace and kind.named(p) == group.name)
