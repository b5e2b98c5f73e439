"""Label, annotation and taint keys that users and the two programs rely on (see DESIGN.md)."""

from typing import Final

DOMAIN: Final = "shoal.dev"
SCHEDULER_NAME: Final = "shoal-scheduler"

# Gang membership.
POD_GROUP_LABEL: Final = "scheduling.x-k8s.io/pod-group"
GANG_LABEL: Final = "shoal.dev/gang"
MIN_MEMBER_ANNOTATION: Final = "shoal.dev/min-member"
MAX_MEMBER_ANNOTATION: Final = "shoal.dev/max-member"
TOPOLOGY_REQUIRED_ANNOTATION: Final = "shoal.dev/topology-required"
TOPOLOGY_PREFERRED_ANNOTATION: Final = "shoal.dev/topology-preferred"

# Node facts.
GPU_RESOURCE: Final = "nvidia.com/gpu"
GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
GPU_COUNT_LABEL: Final = "nvidia.com/gpu.count"
GPU_TOPOLOGY_ANNOTATION: Final = "shoal.dev/gpu-topology"
RACK_LABEL: Final = "shoal.dev/rack"
CAPACITY_TYPE_LABEL: Final = "shoal.dev/capacity-type"
ZONE_LABEL: Final = "topology.kubernetes.io/zone"
REGION_LABEL: Final = "topology.kubernetes.io/region"

#: Cross-node topology levels, widest first.
DEFAULT_TOPOLOGY_KEYS: Final = (
    REGION_LABEL,
    ZONE_LABEL,
    "cloud.google.com/gce-topology-block",
    "topology.k8s.aws/network-node-layer-1",
    "topology.k8s.aws/network-node-layer-2",
    "topology.k8s.aws/network-node-layer-3",
    "cloud.google.com/gce-topology-subblock",
    RACK_LABEL,
)

#: A node is spot capacity when any of these labels has the given value.
SPOT_LABELS: Final = (
    ("karpenter.sh/capacity-type", "spot"),
    ("eks.amazonaws.com/capacityType", "SPOT"),
    ("cloud.google.com/gke-spot", "true"),
    ("cloud.google.com/gke-preemptible", "true"),
    ("kubernetes.azure.com/scalesetpriority", "spot"),
    (CAPACITY_TYPE_LABEL, "spot"),
)

# Revocation.
REVOKING_TAINT: Final = "shoal.dev/revoking"
REVOCATION_ANNOTATION: Final = "shoal.dev/revocation"
LEAVE_BY_ANNOTATION: Final = "shoal.dev/leave-by"
#: Set with ``shoal.dev/leave-by`` when the scheduler reclaims a pod: the gang it makes room for.
RECLAIMED_FOR_ANNOTATION: Final = "shoal.dev/reclaimed-for"
#: Why the pod was asked to leave (human-readable, next to ``shoal.dev/leave-by``).
LEAVE_REASON_ANNOTATION: Final = "shoal.dev/leave-reason"

# kwok's convention for fake nodes (shared with kwokctl, so anyone's test nodes work).
KWOK_NODE_ANNOTATION: Final = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE: Final = "fake"
KWOK_TAINT: Final = "kwok.x-k8s.io/node"


def is_spot(labels: dict[str, str]) -> bool:
    """True when the node's labels mark it as spot / preemptible capacity."""
    return any(labels.get(key) == value for key, value in SPOT_LABELS)
