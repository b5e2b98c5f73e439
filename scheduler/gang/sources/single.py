"""A pod that names no gang is a gang of one (its own topology annotations apply)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from contracts import names
from scheduler.gang.common import GangRef, priority
from scheduler.model import Gang, GangKey, InvalidGang, PodGroup, PodRequest


class SinglePodSource:
    def claims(self, pod: PodRequest) -> GangRef | None:
        return GangRef(GangKey(f"{pod.namespace}/pod:{pod.name}"))

    def build(
        self, key: GangKey, pods: Sequence[PodRequest], groups: Mapping[str, PodGroup]
    ) -> Gang | InvalidGang:
        first = pods[0]
        return Gang(
            key=key,
            namespace=first.namespace,
            name=key.split("/", 1)[1],
            min_member=1,
            max_member=1,
            members=tuple(pods),
            priority=priority(pods),
            created=first.created,
            topology_required=first.annotations.get(names.TOPOLOGY_REQUIRED_ANNOTATION),
            topology_preferred=first.annotations.get(names.TOPOLOGY_PREFERRED_ANNOTATION),
        )
