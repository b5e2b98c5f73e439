"""Gangs from Kubernetes' own PodGroup (``scheduling.k8s.io``, v1beta1 or v1alpha3): a pod's
``spec.schedulingGroup.podGroupName`` names a PodGroup in its namespace. Minimum
``spec.schedulingPolicy.gang.minCount`` (mutable: the gang follows it), or 1 for a ``basic``
policy; maximum the PodGroup's ``shoal.dev/max-member`` annotation, else every member pod;
priority ``spec.priority`` (admission fills it from ``spec.priorityClassName``), else the
members'. Its members wait, with a message, until the PodGroup exists."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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


class KubernetesSource:
    def claims(self, pod: PodRequest) -> GangRef | None:
        if not pod.scheduling_group:
            return None
        ref = group_ref(GroupApi.KUBERNETES, pod.namespace, pod.scheduling_group)
        return GangRef(GangKey(ref), ref)

    def build(
        self, key: GangKey, pods: Sequence[PodRequest], groups: Mapping[str, PodGroup]
    ) -> Gang | InvalidGang:
        ref = str(key)  # this source keys a gang by its PodGroup's reference
        group = groups.get(ref)
        where = f"PodGroup {pods[0].namespace}/{ref.rsplit('/', 1)[1]} (scheduling.k8s.io)"
        if group is None:
            return invalid_gang(
                key,
                pods,
                ref,
                f"{where}, named by spec.schedulingGroup.podGroupName, does not exist; "
                "its members wait for it",
            )
        if group.min_member is None:
            message = f"{where} spec.schedulingPolicy has neither gang nor basic"
            return invalid_gang(key, pods, ref, message, group.uid)
        return group_gang(
            key,
            pods,
            group,
            minimum_field=f"{where} spec.schedulingPolicy.gang.minCount",
            where=where,
        )
