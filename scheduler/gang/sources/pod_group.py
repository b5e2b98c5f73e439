"""Gangs from a PodGroup: the label ``scheduling.x-k8s.io/pod-group`` names a PodGroup in the
pod's namespace (minimum ``spec.minMember``, maximum from the PodGroup's
``shoal.dev/max-member`` annotation, else every member pod). Its members wait, with a message,
until the PodGroup exists."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from contracts import names
from scheduler.gang.sources.common import GangRef, group_gang, invalid_gang
from scheduler.model import Gang, GangKey, InvalidGang, PodGroup, PodRequest


class PodGroupSource:
    def claims(self, pod: PodRequest) -> GangRef | None:
        group = pod.labels.get(names.POD_GROUP_LABEL)
        if not group:
            return None
        ref = f"{pod.namespace}/{group}"
        return GangRef(GangKey(ref), ref)

    def build(
        self, key: GangKey, pods: Sequence[PodRequest], groups: Mapping[str, PodGroup]
    ) -> Gang | InvalidGang:
        ref = str(key)  # this source keys a gang by its PodGroup's namespace/name
        group = groups.get(ref)
        if group is None:
            missing = invalid_gang(
                key,
                pods,
                ref,
                f"PodGroup {ref} (label {names.POD_GROUP_LABEL}) does not exist yet; "
                "its members wait for it rather than run without their gang",
            )
            return replace(missing, reason="PodGroupNotFound")
        return group_gang(
            key,
            pods,
            group,
            minimum_field=f"PodGroup {ref} spec.minMember",
            where=f"PodGroup {ref}",
        )
