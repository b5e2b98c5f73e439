"""Volcano's PodGroup (``scheduling.volcano.sh/v1beta1``): the annotation
``scheduling.k8s.io/group-name`` names a PodGroup in the pod's namespace. Minimum
``spec.minMember``; maximum the PodGroup's ``shoal.dev/max-member`` annotation, else every member
pod; priority the value of ``spec.priorityClassName`` (else the members' own).

``spec.minTaskMember`` counts member pods per task (the ``volcano.sh/task-spec`` annotation a
Volcano Job sets): the gang waits until every task named there has that many member pods. Which
members are placed first is still decided for the gang as a whole (oldest first), so a
``minMember`` below the member count may start a task short of its own minimum.

``spec.queue`` is Volcano's and not read (the scheduler says so with an Event on the PodGroup).

Status (the CRD has no status subresource: it is patched on the object): the phases Volcano
defines, ``Pending`` while its minimum is not bound, ``Inqueue`` once it is (admitted, not yet
running), ``Running`` once ``minMember`` of its pods run; with ``running`` and ``succeeded``
counts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from contracts import names
from scheduler.gang.common import group_gang
from scheduler.gang.kinds.base import Api, Claim, GroupWrite, PodGroupKind, StatusPatch, read
from scheduler.gang.parse import CountError, parse_count
from scheduler.model import Gang, GangKey, InvalidGang, PodGroup, PodPhase, PodRequest


class Volcano(PodGroupKind):
    tag = "volcano"
    title = "volcano"
    api = Api("scheduling.volcano.sh", ("v1beta1",))
    claim = Claim.annotation(names.VOLCANO_GROUP_ANNOTATION)
    uses_priorities = True

    def convert(self, raw: Mapping[str, Any], priorities: Mapping[str, int]) -> PodGroup:
        spec = raw.get("spec") or {}
        tasks = spec.get("minTaskMember")
        if not isinstance(tasks, dict):
            tasks = {}
        klass = str(spec.get("priorityClassName") or "")
        return read(
            raw,
            self,
            spec.get("minMember"),
            min_task_member={str(k): v for k, v in tasks.items()},
            priority_class=klass,
            priority=priorities.get(klass) if klass else None,
            queue=str(spec.get("queue") or ""),
        )

    def where(self, namespace: str, name: str) -> str:
        return f"Volcano PodGroup {namespace}/{name}"

    def gang(
        self, key: GangKey, pods: Sequence[PodRequest], group: PodGroup, where: str
    ) -> Gang | InvalidGang:
        return group_gang(
            key,
            pods,
            group,
            minimum_field=f"{where} spec.minMember",
            where=where,
            check=lambda: _tasks_short(group, pods, where),
            notice=_queue_notice(group, where),
        )

    def status(self, gang: Gang) -> GroupWrite | None:
        running = sum(1 for p in gang.members if p.phase == PodPhase.RUNNING)
        if running >= gang.min_member:
            phase = "Running"
        elif len(gang.bound) >= gang.min_member:
            phase = "Inqueue"
        else:
            phase = "Pending"
        body = {"phase": phase, "running": running, "succeeded": gang.succeeded}
        return StatusPatch(body, subresource=False)


def _tasks_short(group: PodGroup, pods: Sequence[PodRequest], where: str) -> str | None:
    """Why the members do not yet meet ``spec.minTaskMember`` (``None`` when they do)."""
    have = Counter(p.annotations.get(names.VOLCANO_TASK_ANNOTATION, "") for p in pods)
    missing: list[str] = []
    for task, raw in sorted(group.min_task_member.items()):
        if raw == 0:  # no minimum for this task
            continue
        need = parse_count(raw, f"{where} spec.minTaskMember[{task}]")
        if isinstance(need, CountError):
            return need.message
        if have[task] < need:
            missing.append(f"task {task} has {have[task]} of {need}")
    if not missing:
        return None
    return (
        f"{where} spec.minTaskMember is not met ({'; '.join(missing)} member pods, by "
        f"annotation {names.VOLCANO_TASK_ANNOTATION}); its members wait for the rest"
    )


def _queue_notice(group: PodGroup, where: str) -> str:
    if not group.queue:
        return ""
    return (
        f"{where} spec.queue {group.queue!r} is ignored: Shoal has no queues; the gang is "
        "ordered by priority and age with every other gang"
    )
