"""Filter plugins: does a pod fit a node? ``None`` when it does, else the reason, as a value.

Each filter is a pure function ``(pod, state) -> reason | None``; the reasons are the phrases
kube-scheduler users know, so that a counted summary reads like theirs
("0/40 nodes are available: 12 Insufficient nvidia.com/gpu, 3 node(s) revoking").

Static filters look only at the node object (taints, labels, cordon); resource filters look at
what is still free and are re-run as a placement search fills nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from contracts import names
from scheduler.model import Node, NodeName, NodeState, PodRequest, Resources, TaintEffect

Filter = Callable[[PodRequest, NodeState], str | None]

UNSCHEDULABLE = "node(s) were unschedulable"
REVOKING = "node(s) revoking"
SELECTOR = "node(s) didn't match Pod's node affinity/selector"
TOO_MANY_PODS = "Too many pods"
INSUFFICIENT_CPU = "Insufficient cpu"
INSUFFICIENT_MEMORY = "Insufficient memory"
INSUFFICIENT_GPU = f"Insufficient {names.GPU_RESOURCE}"


def unschedulable(pod: PodRequest, state: NodeState) -> str | None:
    """A cordoned node (``spec.unschedulable``) takes no new pods."""
    return UNSCHEDULABLE if state.node.unschedulable else None


def revoking(pod: PodRequest, state: NodeState) -> str | None:
    """A node under a revocation notice takes no new pods, whatever the pod tolerates."""
    if any(t.key == names.REVOKING_TAINT for t in state.node.taints):
        return REVOKING
    return None


def taints(pod: PodRequest, state: NodeState) -> str | None:
    """Every NoSchedule / NoExecute taint must be tolerated."""
    for taint in state.node.taints:
        if taint.effect == TaintEffect.PREFER_NO_SCHEDULE.value:
            continue
        if not any(t.tolerates(taint) for t in pod.tolerations):
            shown = f"{taint.key}: {taint.value}" if taint.value else taint.key
            return f"node(s) had untolerated taint {{{shown}}}"
    return None


def node_affinity(pod: PodRequest, state: NodeState) -> str | None:
    """``nodeSelector`` labels all match, and any one required affinity term matches."""
    labels = state.node.labels
    if any(labels.get(k) != v for k, v in pod.node_selector.items()):
        return SELECTOR
    if pod.affinity and not any(term.matches(labels) for term in pod.affinity):
        return SELECTOR
    return None


def resources(pod: PodRequest, state: NodeState) -> str | None:
    return resources_fit(pod.requests, state.free)


def resources_fit(request: Resources, free: Resources) -> str | None:
    if free.pods < max(request.pods, 1):
        return TOO_MANY_PODS
    if request.cpu_milli > free.cpu_milli:
        return INSUFFICIENT_CPU
    if request.memory > free.memory:
        return INSUFFICIENT_MEMORY
    if request.gpu > free.gpu:
        return INSUFFICIENT_GPU
    return None


STATIC_FILTERS: tuple[Filter, ...] = (unschedulable, revoking, taints, node_affinity)
FILTERS: tuple[Filter, ...] = (*STATIC_FILTERS, resources)


def first_failure(pod: PodRequest, state: NodeState) -> str | None:
    for check in FILTERS:
        reason = check(pod, state)
        if reason is not None:
            return reason
    return None


def first_static_failure(pod: PodRequest, state: NodeState) -> str | None:
    for check in STATIC_FILTERS:
        reason = check(pod, state)
        if reason is not None:
            return reason
    return None


# Static verdicts per (pod constraints, node), valid while the node object is the same one: the
# cache keeps a Node object until the node changes, so a cycle re-runs only the resource filter
# on nodes nobody touched. Bounded: cleared when it holds too many pod shapes.
_STATIC: dict[Hashable, dict[NodeName, tuple[Node, str | None]]] = {}
_STATIC_SHAPES = 256


def static_verdicts(constraints: Hashable) -> dict[NodeName, tuple[Node, str | None]]:
    """The memo of static-filter verdicts for pods with these scheduling ``constraints``
    (selector, affinity, tolerations); pure functions of (constraints, node object)."""
    memo = _STATIC.get(constraints)
    if memo is None:
        if len(_STATIC) >= _STATIC_SHAPES:
            _STATIC.clear()
        memo = _STATIC[constraints] = {}
    return memo
