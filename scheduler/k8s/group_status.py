"""Where PodGroups of each API live, and the status Shoal writes on the ones that are not
scheduler-plugins' (those are written in :mod:`scheduler.k8s.status`).

A Volcano PodGroup (``scheduling.volcano.sh/v1beta1``, no status subresource: the status is
patched on the object) gets the phases Volcano defines: ``Pending`` while its minimum is not
bound, ``Inqueue`` once it is (admitted, not yet running), ``Running`` once ``minMember`` of its
pods run; with ``running`` and ``succeeded`` counts.

A Kubernetes PodGroup (``scheduling.k8s.io``) gets the condition kube-scheduler writes,
``PodGroupInitiallyScheduled``: ``False`` (reason ``Unschedulable``) while its minimum is not
bound, ``True`` once it first is; once ``True`` it never goes back (the API defines it so).
When Shoal reclaims members of such a gang for another one, it also gets the ``DisruptionTarget``
condition the API defines for preemption: ``True``, reason ``PreemptionByScheduler``, and the
message kube-scheduler (v1.37) writes on the pods it preempts, ``<scheduler>: preempting to
accommodate a higher priority podgroup`` (``pod`` when the gang it makes room for is a single
pod). kube-scheduler v1.37 itself writes that condition on the victim pods only; Shoal's victims
get the Eviction API's instead (``docs/architecture.md``, one reclaim).
Which version the cluster serves is found when its informer first lists (:data:`VERSIONS`).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from scheduler.model import Gang, GroupApi, PodPhase, split_group_ref

#: The version Shoal reads and writes for each API; the Kubernetes one is the newest the API
#: server serves, set when it is found.
VERSIONS = {
    GroupApi.SCHEDULER_PLUGINS: "v1alpha1",
    GroupApi.VOLCANO: "v1beta1",
    GroupApi.KUBERNETES: "v1beta1",
}
#: The Kubernetes PodGroup versions Shoal reads, newest first.
KUBERNETES_VERSIONS = ("v1beta1", "v1alpha3")
INITIALLY_SCHEDULED = "PodGroupInitiallyScheduled"
DISRUPTION_TARGET = "DisruptionTarget"
#: The reason of ``DisruptionTarget`` when a scheduler preempted the group (the API's constant).
PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"


def involved(ref: str, uid: str, version: str = "") -> tuple[str, dict[str, str]]:
    """The namespace and ``involvedObject`` of an Event on the PodGroup ``ref``."""
    api, namespace, name = split_group_ref(ref)
    found = {
        "apiVersion": f"{api.value}/{version or VERSIONS.get(api, '')}",
        "kind": "PodGroup",
        "name": name,
    }
    if uid:
        found["uid"] = uid
    return namespace, found


def object_path(ref: str, version: str = "") -> str:
    api, namespace, name = split_group_ref(ref)
    return (
        f"/apis/{api.value}/{version or VERSIONS.get(api, '')}/namespaces/"
        f"{quote(namespace, safe='')}/podgroups/{quote(name, safe='')}"
    )


def volcano_status(gang: Gang) -> dict[str, Any]:
    running = sum(1 for p in gang.members if p.phase == PodPhase.RUNNING)
    if running >= gang.min_member:
        phase = "Running"
    elif len(gang.bound) >= gang.min_member:
        phase = "Inqueue"
    else:
        phase = "Pending"
    return {"phase": phase, "running": running, "succeeded": gang.succeeded}


def kubernetes_condition(gang: Gang) -> dict[str, Any]:
    """The ``PodGroupInitiallyScheduled`` condition for ``gang`` now (without its time)."""
    bound = len(gang.bound)
    if bound >= gang.min_member:
        return {
            "type": INITIALLY_SCHEDULED,
            "status": "True",
            "reason": "Scheduled",
            "message": f"{bound} members bound (minCount {gang.min_member})",
        }
    return {
        "type": INITIALLY_SCHEDULED,
        "status": "False",
        "reason": "Unschedulable",
        "message": f"{bound} of minCount {gang.min_member} members bound; the rest wait "
        "to be placed together",
    }


def disruption_condition(scheduler_name: str, preemptor: Gang) -> dict[str, Any]:
    """The ``DisruptionTarget`` condition for a gang whose members are reclaimed to make room
    for ``preemptor`` (without its time)."""
    kind = "podgroup" if preemptor.pod_group is not None or preemptor.max_member > 1 else "pod"
    return {
        "type": DISRUPTION_TARGET,
        "status": "True",
        "reason": PREEMPTION_BY_SCHEDULER,
        "message": f"{scheduler_name}: preempting to accommodate a higher priority {kind}",
    }


def merged_condition(
    raw: dict[str, Any], condition: dict[str, Any], now: str
) -> dict[str, Any] | None:
    """``condition`` as it is to be written on the PodGroup object ``raw``: with the time it
    last changed status (``now``, or the time already there when the status is the same);
    ``None`` when nothing is to be written (``PodGroupInitiallyScheduled`` is ``True`` there,
    which is for good)."""
    for old in (raw.get("status") or {}).get("conditions") or []:
        if old.get("type") != condition["type"]:
            continue
        sticky = condition["type"] == INITIALLY_SCHEDULED
        if sticky and old.get("status") == "True" and condition["status"] != "True":
            return None
        if old.get("status") == condition["status"] and old.get("lastTransitionTime"):
            return {**condition, "lastTransitionTime": old["lastTransitionTime"]}
    return {**condition, "lastTransitionTime": now}
