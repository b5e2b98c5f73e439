"""Gangs without a CRD: the label ``shoal.dev/gang`` names the gang; the members'
``shoal.dev/min-member`` / ``shoal.dev/max-member`` annotations (which must agree) give its
sizes. An absent minimum means every member pod; an absent maximum means the minimum or every
member pod, whichever is larger."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from contracts import names
from scheduler.gang.common import GangRef, agreed, invalid_gang, maximum, sized_gang
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
        minimum = self._minimum(pods, where)
        if isinstance(minimum, CountError):
            return invalid_gang(key, pods, None, minimum.message)
        raw_max = agreed(pods, names.MAX_MEMBER_ANNOTATION)
        if isinstance(raw_max, CountError):
            return invalid_gang(key, pods, None, raw_max.message)
        annotations = {} if raw_max is None else {names.MAX_MEMBER_ANNOTATION: raw_max}
        most = maximum(annotations, minimum, len(pods), where)
        if isinstance(most, CountError):
            return invalid_gang(key, pods, None, most.message)
        return sized_gang(key, pods, (minimum, most), {})

    @staticmethod
    def _minimum(pods: Sequence[PodRequest], where: str) -> int | CountError:
        raw = agreed(pods, names.MIN_MEMBER_ANNOTATION)
        if raw is None:
            return len(pods)
        if isinstance(raw, CountError):
            return raw
        return parse_count(raw, f"{where} annotation {names.MIN_MEMBER_ANNOTATION}")
