"""Kubernetes' own PodGroup (``scheduling.k8s.io``, v1beta1 or v1alpha3, the same fields; read in
the newest version served): a pod's ``spec.schedulingGroup.podGroupName`` names a PodGroup in its
namespace. Minimum ``spec.schedulingPolicy.gang.minCount`` (mutable: the gang follows it), or 1
for a ``basic`` policy (its pods need not start together); maximum the PodGroup's
``shoal.dev/max-member`` annotation, else every member pod; priority ``spec.priority``
(admission fills it from ``spec.priorityClassName``), else the members'. Asked after the
``shoal.dev/gang`` label: a Job controller sets the field on its own, with WorkloadWithJob.

Status: the condition kube-scheduler writes, ``PodGroupInitiallyScheduled``: ``False`` (reason
``Unschedulable``) while its minimum is not bound, ``True`` once it first is; once ``True`` it
never goes back (the API defines it so). When Shoal reclaims members of such a gang for another
one, it also gets the ``DisruptionTarget`` condition the API defines for preemption: ``True``,
reason ``PreemptionByScheduler``, and the message kube-scheduler (v1.37) writes on the pods it
preempts, ``<scheduler>: preempting to accommodate a higher priority podgroup`` (``pod`` when the
gang it makes room for is a single pod). kube-scheduler v1.37 itself writes that condition on the
victim pods only; Shoal's victims get the Eviction API's instead (``docs/architecture.md``, one
reclaim)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scheduler.gang.common import invalid_gang
from scheduler.gang.kinds.base import (
    Api,
    Claim,
    ConditionPatch,
    GroupWrite,
    InvalidGangText,
    PodGroupKind,
    read,
)
from scheduler.model import Gang, GangKey, InvalidGang, PodGroup, PodRequest

INITIALLY_SCHEDULED = "PodGroupInitiallyScheduled"
DISRUPTION_TARGET = "DisruptionTarget"
#: The reason of ``DisruptionTarget`` when a scheduler preempted the group (the API's constant).
PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"


class Kubernetes(PodGroupKind):
    tag = "k8s"
    title = "kubernetes"
    api = Api("scheduling.k8s.io", ("v1beta1", "v1alpha3"))
    claim = Claim("spec.schedulingGroup.podGroupName", lambda pod: pod.scheduling_group)
    after_label = True
    minimum_field = "spec.schedulingPolicy.gang.minCount"

    def convert(self, raw: Mapping[str, Any], priorities: Mapping[str, int]) -> PodGroup:
        spec = raw.get("spec") or {}
        policy = spec.get("schedulingPolicy") or {}
        if isinstance(policy.get("gang"), dict):
            minimum = policy["gang"].get("minCount")
        else:
            minimum = 1 if "basic" in policy else None
        priority = spec.get("priority")
        return read(
            raw,
            self,
            minimum,
            priority_class=str(spec.get("priorityClassName") or ""),
            priority=priority
            if isinstance(priority, int) and not isinstance(priority, bool)
            else None,
        )

    def where(self, namespace: str, name: str) -> str:
        return f"PodGroup {namespace}/{name} ({self.api.group})"

    def missing(self, where: str) -> InvalidGangText:
        return InvalidGangText(
            f"{where}, named by {self.claim.text}, does not exist; its members wait for it"
        )

    def gang(
        self, key: GangKey, pods: Sequence[PodRequest], group: PodGroup, where: str
    ) -> Gang | InvalidGang:
        if group.min_member is None:
            message = f"{where} spec.schedulingPolicy has neither gang nor basic"
            return invalid_gang(key, pods, str(key), message, group.uid)
        return super().gang(key, pods, group, where)

    def status(self, gang: Gang) -> GroupWrite | None:
        bound = len(gang.bound)
        if bound >= gang.min_member:
            condition = {
                "type": INITIALLY_SCHEDULED,
                "status": "True",
                "reason": "Scheduled",
                "message": f"{bound} members bound (minCount {gang.min_member})",
            }
        else:
            condition = {
                "type": INITIALLY_SCHEDULED,
                "status": "False",
                "reason": "Unschedulable",
                "message": f"{bound} of minCount {gang.min_member} members bound; the rest "
                "wait to be placed together",
            }
        return ConditionPatch(condition, sticky=True)

    def disrupted(self, scheduler_name: str, preemptor: Gang) -> GroupWrite | None:
        single = preemptor.pod_group is None and preemptor.max_member <= 1
        return ConditionPatch(
            {
                "type": DISRUPTION_TARGET,
                "status": "True",
                "reason": PREEMPTION_BY_SCHEDULER,
                "message": f"{scheduler_name}: preempting to accommodate a higher priority "
                f"{'pod' if single else 'podgroup'}",
            }
        )
