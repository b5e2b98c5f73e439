"""What every gang source shares: the reference a source claims a pod with, and the readings
of sizes and topology that more than one source makes."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from contracts import names
from scheduler.gang.parse import CountError, check_bounds, parse_count
from scheduler.model import Gang, GangKey, InvalidGang, PodGroup, PodRequest


@dataclass(frozen=True, slots=True)
class GangRef:
    """The gang a source says a pod belongs to."""

    key: GangKey
    #: ``namespace/name`` of the object that defines the gang (a PodGroup), if there is one:
    #: the gang is rebuilt when that object changes.
    group: str | None = None


def invalid_gang(
    key: GangKey,
    pods: Sequence[PodRequest],
    group: str | None,
    message: str,
    group_uid: str = "",
) -> InvalidGang:
    """The gang ``key`` cannot be scheduled as defined; ``message`` says why."""
    return InvalidGang(
        key=key,
        namespace=pods[0].namespace,
        name=key.split("/", 1)[1],
        message=message,
        members=tuple(pods),
        pod_group=group,
        pod_group_uid=group_uid,
    )


def priority(pods: Sequence[PodRequest]) -> int:
    """A gang is as urgent as its most urgent member."""
    return max(p.priority for p in pods)


def maximum(
    annotations: Mapping[str, str], minimum: int, member_count: int, where: str
) -> int | CountError:
    """The ``shoal.dev/max-member`` in ``annotations``, at least ``minimum``; without one, the
    minimum or every member pod, whichever is larger."""
    raw = annotations.get(names.MAX_MEMBER_ANNOTATION)
    if raw is None:
        return max(minimum, member_count)
    max_where = f"{where} annotation {names.MAX_MEMBER_ANNOTATION}"
    value = parse_count(raw, max_where)
    if isinstance(value, CountError):
        return value
    error = check_bounds(minimum, value, "the minimum", max_where)
    return error if error is not None else value


def topology(
    group_annotations: Mapping[str, str], pods: Sequence[PodRequest], *, required: bool
) -> str | None:
    """The topology key the gang must (``required``) or should keep to: the defining object's
    annotation wins (an empty one means none), else the first member that gives one."""
    key = names.TOPOLOGY_REQUIRED_ANNOTATION if required else names.TOPOLOGY_PREFERRED_ANNOTATION
    if key in group_annotations:
        return group_annotations[key] or None
    for pod in pods:
        if pod.annotations.get(key):
            return pod.annotations[key]
    return None


def sized_gang(
    key: GangKey,
    pods: Sequence[PodRequest],
    sizes: tuple[int, int],
    annotations: Mapping[str, str],
    *,
    created: float = 0.0,
    group: str | None = None,
    group_uid: str = "",
    group_priority: int | None = None,
    notice: str = "",
) -> Gang:
    """The gang ``key`` with ``sizes`` (minimum, maximum) read by its source; priority and
    topology are taken the same way for every source (``annotations``: the group's own, which
    win over the members'; ``group_priority``: the group's own priority, which wins over the
    members')."""
    first = pods[0]
    return Gang(
        key=key,
        namespace=first.namespace,
        name=key.split("/", 1)[1],
        min_member=sizes[0],
        max_member=sizes[1],
        members=tuple(pods),
        priority=priority(pods) if group_priority is None else group_priority,
        created=created or first.created,
        topology_required=topology(annotations, pods, required=True),
        topology_preferred=topology(annotations, pods, required=False),
        pod_group=group,
        pod_group_uid=group_uid,
        pod_group_notice=notice,
    )


def group_gang(
    key: GangKey,
    pods: Sequence[PodRequest],
    group: PodGroup,
    *,
    minimum_field: str,
    where: str,
    check: Callable[[], str | None] | None = None,
    notice: str = "",
) -> Gang | InvalidGang:
    """The gang a PodGroup defines, whatever its kind: the minimum read from
    ``group.min_member`` (``minimum_field`` names it in a message), then ``check`` (a reason the
    members cannot meet the group yet, or ``None``), then the maximum from the group's
    ``shoal.dev/max-member``; ``where`` names the group in messages."""
    ref = str(key)
    minimum = parse_count(group.min_member, minimum_field)
    if isinstance(minimum, CountError):
        return invalid_gang(key, pods, ref, minimum.message, group.uid)
    short = check() if check is not None else None
    if short is not None:
        return invalid_gang(key, pods, ref, short, group.uid)
    most = maximum(group.annotations, minimum, len(pods), where)
    if isinstance(most, CountError):
        return invalid_gang(key, pods, ref, most.message, group.uid)
    return sized_gang(
        key,
        pods,
        (minimum, most),
        group.annotations,
        created=group.created,
        group=ref,
        group_uid=group.uid,
        group_priority=group.priority,
        notice=notice,
    )
