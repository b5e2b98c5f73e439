"""Label, annotation and taint keys users and the two programs rely on (docs/architecture.md)."""

import re
from typing import Final

DOMAIN: Final = "shoal.dev"
SCHEDULER_NAME: Final = "shoal-scheduler"

# Gang membership.
POD_GROUP_LABEL: Final = "scheduling.x-k8s.io/pod-group"
#: Volcano's way for a pod to name its PodGroup (``scheduling.volcano.sh``).
VOLCANO_GROUP_ANNOTATION: Final = "scheduling.k8s.io/group-name"
#: The task a Volcano Job gives each of its pods (what ``minTaskMember`` counts).
VOLCANO_TASK_ANNOTATION: Final = "volcano.sh/task-spec"
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
#: A worker's latest progress report, written by the node agent (``contracts.progress``).
PROGRESS_ANNOTATION: Final = "shoal.dev/progress"

# kwok's convention for fake nodes (shared with kwokctl, so anyone's test nodes work).
KWOK_NODE_ANNOTATION: Final = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE: Final = "fake"
KWOK_TAINT: Final = "kwok.x-k8s.io/node"


def is_spot(labels: dict[str, str]) -> bool:
    """True when the node's labels mark it as spot / preemptible capacity."""
    return any(labels.get(key) == value for key, value in SPOT_LABELS)


# The wiring the scheduler's admission webhook adds to its pods (README "Automatic wiring").
#: Ask for a checkpoint volume: an existing PersistentVolumeClaim by name...
CHECKPOINT_CLAIM_ANNOTATION: Final = "shoal.dev/checkpoint-claim"
#: ...or a volume of this size (a quantity, e.g. ``10Gi``) that lives as long as the pod,
CHECKPOINT_SIZE_ANNOTATION: Final = "shoal.dev/checkpoint-size"
#: of this StorageClass (the cluster's default when absent),
CHECKPOINT_STORAGE_CLASS_ANNOTATION: Final = "shoal.dev/checkpoint-storage-class"
#: mounted here in every container (default ``/checkpoints``).
CHECKPOINT_PATH_ANNOTATION: Final = "shoal.dev/checkpoint-path"
#: How long the pod's checkpoint takes, in seconds (``20``, ``1.5``; at most a day): a notice
#: that gives less gets a Warning Event on the pod saying what will be lost (docs/workers.md).
CHECKPOINT_SECONDS_ANNOTATION: Final = "shoal.dev/checkpoint-seconds"
#: The longest checkpoint time ``shoal.dev/checkpoint-seconds`` may declare.
MAX_CHECKPOINT_SECONDS: Final = 86400.0
#: Set by the webhook on a pod whose wiring request it could not follow: what was wrong.
WIRING_WARNING_ANNOTATION: Final = "shoal.dev/wiring-warning"
#: The worker library's environment: the pod's identity, the agent's socket, the files.
POD_NAMESPACE_ENV: Final = "POD_NAMESPACE"
POD_NAME_ENV: Final = "POD_NAME"
POD_UID_ENV: Final = "POD_UID"
SOCKET_ENV: Final = "SHOAL_SOCKET"
LEAVE_BY_FILE_ENV: Final = "SHOAL_LEAVE_BY_FILE"
#: The group that owns the agent's socket folder on the host (mode 2770, the agent's own group
#: in its DaemonSet); a worker joins it to connect.
SOCKET_GROUP: Final = 65532
CHECKPOINT_DIR_ENV: Final = "SHOAL_CHECKPOINT_DIR"
#: ``shoal.dev/checkpoint-seconds`` as the worker library reads it.
CHECKPOINT_SECONDS_ENV: Final = "SHOAL_CHECKPOINT_SECONDS"


def parse_checkpoint_seconds(text: str) -> float:
    """The seconds ``shoal.dev/checkpoint-seconds`` declares: a plain decimal number above 0 and
    at most :data:`MAX_CHECKPOINT_SECONDS`; ``ValueError`` for anything else."""
    value = text.strip()
    if not _SECONDS.fullmatch(value):
        raise ValueError(f"{text!r} is not a number of seconds")
    seconds = float(value)
    if not 0 < seconds <= MAX_CHECKPOINT_SECONDS:
        raise ValueError(f"{text!r} is not between 0 and {MAX_CHECKPOINT_SECONDS:g} seconds")
    return seconds


_SECONDS = re.compile(r"^(\d+(\.\d*)?|\.\d+)$")
