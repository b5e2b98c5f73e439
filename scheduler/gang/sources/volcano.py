"""Gangs from a Volcano PodGroup (``scheduling.volcano.sh/v1beta1``): the annotation
``scheduling.k8s.io/group-name`` names a PodGroup in the pod's namespace. Minimum
``spec.minMember``; maximum the PodGroup's ``shoal.dev/max-member`` annotation, else every member
pod; priority the value of ``spec.priorityClassName`` (else the members' own).

``spec.minTaskMember`` counts member pods per task (the ``volcano.sh/task-spec`` annotation a
Volcano Job sets): the gang waits until every task named there has that many member pods. Which
members are placed first is still decided for the gang as a whole (oldest first), so a
``minMember`` below the member count may start a task short of its own minimum.

``spec.queue`` is Volcano's and not read (the scheduler says so with an Event on the PodGroup).
Its members wait, with a message, until the PodGroup exists."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from contracts import names
from scheduler.gang.parse import CountError, parse_count
from scheduler.gang.sources.common import GangRef, group_gang, invalid_gang
from scheduler.model import (
    Gang,
    GangKey,
    GroupApi,
    InvalidGang,
    PodGroup,
    PodRequest,
    group_ref,
)


class VolcanoSource:
    def claims(self, pod: PodRequest) -> GangRef | None:
        group = pod.annotations.get(names.VOLCANO_GROUP_ANNOTATION)
        if not group:
            return None
        ref = group_ref(GroupApi.VOLCANO, pod.namespace, group)
        return GangRef(GangKey(ref), ref)

    def build(
        self, key: GangKey, pods: Sequence[PodRequest], groups: Mapping[str, PodGroup]
    ) -> Gang | InvalidGang:
        ref = str(key)  # this source keys a gang by its PodGroup's reference
        group = groups.get(ref)
        where = f"Volcano PodGroup {pods[0].namespace}/{ref.rsplit('/', 1)[1]}"
        if group is None:
            return invalid_gang(
                key,
                pods,
                ref,
                f"{where} (annotation {names.VOLCANO_GROUP_ANNOTATION}) does not exist; "
                "its members wait for it",
            )
        return group_gang(
            key,
            pods,
            group,
            minimum_field=f"{where} spec.minMember",
            where=where,
            check=lambda: _tasks_short(group, pods, where),
            notice=_queue_notice(group, where),
        )


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
