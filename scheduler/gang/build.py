"""Group pod requests into gangs.

Membership (DESIGN.md): the label ``scheduling.x-k8s.io/pod-group`` names a PodGroup in the
pod's namespace (minimum ``spec.minMember``, maximum from the PodGroup's
``shoal.dev/max-member`` annotation, else every member pod); otherwise the label
``shoal.dev/gang`` names a CRD-free gang (minimum and maximum from the members'
``shoal.dev/min-member`` / ``shoal.dev/max-member`` annotations; an absent minimum means every
member pod, an absent maximum means the minimum or every member pod, whichever is larger). The
PodGroup label wins when a pod carries both. A pod with neither is a gang of one.

Succeeded and Failed pods are not members: they neither count toward the minimum nor hold room.
Only gangs with at least one pod for ``scheduler_name`` are returned.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from contracts import names
from scheduler.gang.parse import CountError, check_bounds, parse_count
from scheduler.model import Gang, GangKey, InvalidGang, PodGroup, PodRequest


def gang_of(pod: PodRequest) -> tuple[GangKey, str | None]:
    """The key of the pod's gang and, for the PodGroup source, the PodGroup's ``ns/name``."""
    group = pod.labels.get(names.POD_GROUP_LABEL)
    if group:
        return GangKey(f"{pod.namespace}/{group}"), f"{pod.namespace}/{group}"
    label = pod.labels.get(names.GANG_LABEL)
    if label:
        return GangKey(f"{pod.namespace}/{label}"), None
    return GangKey(f"{pod.namespace}/pod:{pod.name}"), None


def build_gangs(
    pods: Iterable[PodRequest],
    pod_groups: Mapping[str, PodGroup],
    scheduler_name: str,
) -> tuple[list[Gang], list[InvalidGang]]:
    """Gangs with work for ``scheduler_name``, and the ones whose definition is wrong.

    ``pod_groups`` maps ``namespace/name`` to the PodGroup objects that exist.
    """
    return GangBuilder(scheduler_name).build(pods, pod_groups)


class GangBuilder:
    """``build_gangs`` that remembers its results: a gang whose member objects and PodGroup are
    the very same objects as last time is not rebuilt (cycles differ by a few pods).

    Given the members already grouped by gang (``Snapshot.members``, kept up to date by the
    cache as pods change), a cycle costs one identity check per gang instead of a pass over
    every pod.
    """

    def __init__(self, scheduler_name: str) -> None:
        self.scheduler_name = scheduler_name
        self._memo: dict[
            GangKey, tuple[Sequence[PodRequest], object, Gang | InvalidGang | None]
        ] = {}

    def build(
        self,
        pods: Iterable[PodRequest],
        pod_groups: Mapping[str, PodGroup],
        grouped: Mapping[GangKey, Sequence[PodRequest]] | None = None,
    ) -> tuple[list[Gang], list[InvalidGang]]:
        if grouped is None:
            by_key: dict[GangKey, list[PodRequest]] = defaultdict(list)
            for pod in pods:
                by_key[gang_of(pod)[0]].append(pod)
            grouped = by_key

        gangs: list[Gang] = []
        invalid: list[InvalidGang] = []
        memo: dict[GangKey, tuple[Sequence[PodRequest], object, Gang | InvalidGang | None]] = {}
        for key, members in grouped.items():
            if not members:
                continue
            ref = gang_of(members[0])[1]
            group_obj = pod_groups.get(ref) if ref is not None else None
            old = self._memo.get(key)
            if (
                old is not None
                and old[1] is group_obj
                and (
                    old[0] is members
                    or (
                        len(old[0]) == len(members)
                        and all(a is b for a, b in zip(old[0], members, strict=True))
                    )
                )
            ):
                result = old[2]
            else:
                result = self._one(key, members, ref, pod_groups)
            memo[key] = (members, group_obj, result)
            if isinstance(result, Gang):
                gangs.append(result)
            elif result is not None:
                invalid.append(result)
        self._memo = memo
        return gangs, invalid

    def _one(
        self,
        key: GangKey,
        members: Sequence[PodRequest],
        ref: str | None,
        pod_groups: Mapping[str, PodGroup],
    ) -> Gang | InvalidGang | None:
        live = [p for p in members if not p.finished]
        if not any(p.scheduler_name == self.scheduler_name for p in live):
            return None
        live.sort(key=lambda p: (p.created, p.name))
        return _one(key, tuple(live), ref, pod_groups, self.scheduler_name)


def _one(
    key: GangKey,
    pods: tuple[PodRequest, ...],
    group_ref: str | None,
    pod_groups: Mapping[str, PodGroup],
    scheduler_name: str,
) -> Gang | InvalidGang:
    first = pods[0]
    name = key.split("/", 1)[1]

    def bad(message: str) -> InvalidGang:
        return InvalidGang(
            key=key,
            namespace=first.namespace,
            name=name,
            message=message,
            members=pods,
            pod_group=group_ref,
        )

    others = sorted({p.scheduler_name for p in pods} - {scheduler_name})
    if others:
        return bad(
            f"members ask for different schedulerNames ({scheduler_name}, "
            f"{', '.join(others)}); every member of a gang must use {scheduler_name}"
        )

    priority = max(p.priority for p in pods)
    if group_ref is not None:
        group = pod_groups.get(group_ref)
        if group is None:
            return bad(
                f"PodGroup {group_ref} (label {names.POD_GROUP_LABEL}) does not exist yet; "
                "its members wait for it"
            )
        minimum = parse_count(group.min_member, f"PodGroup {group_ref} spec.minMember")
        if isinstance(minimum, CountError):
            return bad(minimum.message)
        maximum = _maximum(group.annotations, minimum, len(pods), f"PodGroup {group_ref}")
        if isinstance(maximum, CountError):
            return bad(maximum.message)
        return Gang(
            key=key,
            namespace=first.namespace,
            name=name,
            min_member=minimum,
            max_member=maximum,
            members=pods,
            priority=priority,
            created=group.created or first.created,
            topology_required=_topology(group.annotations, pods, required=True),
            topology_preferred=_topology(group.annotations, pods, required=False),
            pod_group=group_ref,
        )

    if names.GANG_LABEL not in first.labels:
        return Gang(
            key=key,
            namespace=first.namespace,
            name=name,
            min_member=1,
            max_member=1,
            members=pods,
            priority=priority,
            created=first.created,
            topology_required=first.annotations.get(names.TOPOLOGY_REQUIRED_ANNOTATION),
            topology_preferred=first.annotations.get(names.TOPOLOGY_PREFERRED_ANNOTATION),
        )

    where = f"gang {key}"
    raw_min = _agreed(pods, names.MIN_MEMBER_ANNOTATION)
    if isinstance(raw_min, CountError):
        return bad(raw_min.message)
    if raw_min is None:
        minimum_or_error: int | CountError = len(pods)
    else:
        minimum_or_error = parse_count(raw_min, f"{where} annotation {names.MIN_MEMBER_ANNOTATION}")
    if isinstance(minimum_or_error, CountError):
        return bad(minimum_or_error.message)
    raw_max = _agreed(pods, names.MAX_MEMBER_ANNOTATION)
    if isinstance(raw_max, CountError):
        return bad(raw_max.message)
    annotations = {} if raw_max is None else {names.MAX_MEMBER_ANNOTATION: raw_max}
    maximum = _maximum(annotations, minimum_or_error, len(pods), where)
    if isinstance(maximum, CountError):
        return bad(maximum.message)
    return Gang(
        key=key,
        namespace=first.namespace,
        name=name,
        min_member=minimum_or_error,
        max_member=maximum,
        members=pods,
        priority=priority,
        created=first.created,
        topology_required=_topology({}, pods, required=True),
        topology_preferred=_topology({}, pods, required=False),
    )


def _agreed(pods: Sequence[PodRequest], annotation: str) -> str | CountError | None:
    """The one value the members give for ``annotation`` (``None`` when none gives one)."""
    values = sorted({p.annotations[annotation] for p in pods if annotation in p.annotations})
    if len(values) > 1:
        return CountError(
            f"members disagree on annotation {annotation}: {', '.join(repr(v) for v in values)}"
        )
    return values[0] if values else None


def _maximum(
    annotations: Mapping[str, str], minimum: int, member_count: int, where: str
) -> int | CountError:
    raw = annotations.get(names.MAX_MEMBER_ANNOTATION)
    if raw is None:
        return max(minimum, member_count)
    max_where = f"{where} annotation {names.MAX_MEMBER_ANNOTATION}"
    maximum = parse_count(raw, max_where)
    if isinstance(maximum, CountError):
        return maximum
    error = check_bounds(minimum, maximum, "the minimum", max_where)
    return error if error is not None else maximum


def _topology(
    group_annotations: Mapping[str, str], pods: Sequence[PodRequest], *, required: bool
) -> str | None:
    key = names.TOPOLOGY_REQUIRED_ANNOTATION if required else names.TOPOLOGY_PREFERRED_ANNOTATION
    if key in group_annotations:
        return group_annotations[key] or None
    for pod in pods:
        if pod.annotations.get(key):
            return pod.annotations[key]
    return None
