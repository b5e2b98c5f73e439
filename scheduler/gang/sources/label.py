"""Gangs without a CRD: the label ``shoal.dev/gang`` names the gang; the members'
``shoal.dev/min-member`` / ``shoal.dev/max-member`` annotations give its sizes. An absent minimum
means every member pod; an absent maximum means the minimum or every member pod, whichever is
larger.

The annotations may change while the gang runs (a stage of a training job): whoever changes them
patches the members one at a time, so members that disagree are a change under way, not an
error. Until they agree, the gang keeps the lowest minimum and the highest maximum its members
give: nothing is asked to leave and no member is bound that the gang could not keep under either
reading (a value that is not a count is still an error)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from contracts import names
from scheduler.gang.common import GangRef, invalid_gang, maximum, sized_gang
from scheduler.gang.parse import CountError, parse_count
from scheduler.model import Gang, GangKey, InvalidGang, PodGroup, PodRequest


class LabelSource:
    def claims(self, pod: PodRequest) -> GangRef | None:
        label = pod.labels.get(names.GANG_LABEL)
        return GangRef(GangKey(f"{pod.namespace}/{label}")) if label else None

    def build(
        self, key: GangKey, pods: Sequence[PodRequest], groups: Mapping[str, PodGroup]
    ) -> Gang | InvalidGang:
        where = f"gang {key}"
        lows = counts(pods, names.MIN_MEMBER_ANNOTATION, where)
        if isinstance(lows, CountError):
            return invalid_gang(key, pods, None, lows.message)
        minimum = min(lows) if lows else len(pods)
        highs = counts(pods, names.MAX_MEMBER_ANNOTATION, where)
        if isinstance(highs, CountError):
            return invalid_gang(key, pods, None, highs.message)
        annotations = {names.MAX_MEMBER_ANNOTATION: str(max(highs))} if highs else {}
        most = maximum(annotations, minimum, len(pods), where)
        if isinstance(most, CountError):
            return invalid_gang(key, pods, None, most.message)
        return sized_gang(key, pods, (minimum, most), {})


def counts(pods: Sequence[PodRequest], annotation: str, where: str) -> list[int] | CountError:
    """Every distinct count the members give in ``annotation`` (none when no member gives one);
    the first value that is not a count is an error."""
    found: list[int] = []
    for raw in sorted({p.annotations[annotation] for p in pods if annotation in p.annotations}):
        value = parse_count(raw, f"{where} annotation {annotation}")
        if isinstance(value, CountError):
            return value
        found.append(value)
    return found
