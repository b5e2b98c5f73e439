"""Kueue's pod groups: plain pods that Kueue admits together (Kueue v0.17,
``pkg/controller/jobs/pod``; docs/kueue.md).

The pods of a namespace whose ``kueue.x-k8s.io/pod-group-name`` names the same group are one
gang, keyed ``namespace/kueue:<name>``. The name is the pod's label of that key or, where
Kueue's ``WorkloadIdentifierAnnotations`` feature gate has it write an annotation instead, the
annotation of the same key (which wins, as it does in Kueue when the gate is on).

The gang's size is the annotation ``kueue.x-k8s.io/pod-group-total-count``: Kueue reserves the
group's quota for exactly that many pods, so it is both the gang's minimum and its maximum, and
the ``shoal.dev/min-member`` / ``shoal.dev/max-member`` annotations are not read (a Kueue pod
group never grows beyond what Kueue admitted). Every member must carry the same count, as Kueue
itself requires; one that carries none, or another count, makes the gang invalid with a message
naming the annotation. There is no object to look up: the gang exists while its pods do.

A group with ``kueue.x-k8s.io/pod-group-fast-admission: "true"`` is admitted before its pods
exist, and its pods are ungated as they come: Kueue's StatefulSet integration sets it, and a
StatefulSet (``OrderedReady``, its default) creates each pod only once the one before it is
ready. Its gang's minimum is 1 (its maximum still the count): a minimum of the count would wait
for pods that are never created.

Kueue keeps every member gated (``kueue.x-k8s.io/admission``, and with topology-aware
scheduling ``kueue.x-k8s.io/topology``) until it admits the group, and Shoal binds no gated pod
(:attr:`scheduler.model.PodRequest.gated`): the gang is bound when all its members are ungated,
all at once, each where the node selector Kueue gave it allows. A pod that both names a Kueue
pod group and carries the ``shoal.dev/gang`` label, or names a PodGroup by label or annotation,
is claimed twice: it waits with an Event naming both (:func:`scheduler.gang.sources.claim`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scheduler.gang.common import GangRef, invalid_gang, sized_gang
from scheduler.gang.kinds.base import Claim
from scheduler.gang.parse import parse_count
from scheduler.model import Gang, GangKey, InvalidGang, PodGroup, PodRequest

#: Names the group a pod belongs to (a label; an annotation with Kueue's
#: ``WorkloadIdentifierAnnotations`` feature gate).
GROUP_NAME = "kueue.x-k8s.io/pod-group-name"
#: How many pods the group has: what Kueue admits it for.
TOTAL_COUNT = "kueue.x-k8s.io/pod-group-total-count"
#: ``"true"``: Kueue admits the group before all its pods exist; they come one by one.
FAST_ADMISSION = "kueue.x-k8s.io/pod-group-fast-admission"
#: The scheduling gate Kueue's pod webhook puts on every pod it manages, removed at admission.
ADMISSION_GATE = "kueue.x-k8s.io/admission"
#: The gate topology-aware scheduling adds; removed with each pod's domain as a node selector.
TOPOLOGY_GATE = "kueue.x-k8s.io/topology"
#: The gate on the pods of an elastic Job (workload slices) until a slice admits them.
ELASTIC_JOB_GATE = "kueue.x-k8s.io/elastic-job"


def group_name(pod: PodRequest) -> str:
    """The Kueue pod group ``pod`` names ("" when none)."""
    return pod.annotations.get(GROUP_NAME) or pod.labels.get(GROUP_NAME) or ""


class KueuePodGroup:
    """The gang source of Kueue's pod groups."""

    claim = Claim(f"label {GROUP_NAME}", group_name)
    tag = "kueue"

    def claims(self, pod: PodRequest) -> GangRef | None:
        name = group_name(pod)
        return GangRef(GangKey(f"{pod.namespace}/{self.tag}:{name}")) if name else None

    def build(
        self, key: GangKey, pods: Sequence[PodRequest], groups: Mapping[str, PodGroup]
    ) -> Gang | InvalidGang:
        where = f"Kueue pod group {key.replace(f'/{self.tag}:', '/', 1)}"
        missing = [p.name for p in pods if TOTAL_COUNT not in p.annotations]
        if missing:
            return invalid_gang(
                key,
                pods,
                None,
                f"{where}: pod {missing[0]} has no annotation {TOTAL_COUNT}; every member must "
                "say how many pods the group has (Kueue admits none of it until they do)",
            )
        counts = sorted({p.annotations[TOTAL_COUNT] for p in pods})
        if len(counts) > 1:
            return invalid_gang(
                key,
                pods,
                None,
                f"{where}: members give different annotation {TOTAL_COUNT} values "
                f"({', '.join(repr(c[:20]) for c in counts)}); every member must give the same",
            )
        total = parse_count(counts[0], f"{where} annotation {TOTAL_COUNT}")
        if not isinstance(total, int):
            return invalid_gang(key, pods, None, total.message)
        fast = any(p.annotations.get(FAST_ADMISSION) == "true" for p in pods)
        return sized_gang(key, pods, (1 if fast else total, total), {})
