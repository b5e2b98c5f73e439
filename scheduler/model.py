"""Value types of the scheduling core: nodes, pod requests, gangs, placements and statuses.

Everything here is a frozen, slotted dataclass built once at the adapter edge from API objects
and never mutated. The core takes these values (and ``now``) and returns values; "does not fit"
is a :class:`Unschedulable` status with counted reasons, never an exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NewType

from contracts.gputopology import GpuTopology

#: ``namespace/name`` of a pod.
PodKey = NewType("PodKey", str)
#: ``namespace/name`` of a gang (the PodGroup's or the ``shoal.dev/gang`` label's name), or
#: ``namespace/pod:<name>`` for a pod that is a gang of one.
GangKey = NewType("GangKey", str)
NodeName = NewType("NodeName", str)


def pod_key(namespace: str, name: str) -> PodKey:
    return PodKey(f"{namespace}/{name}")


@dataclass(frozen=True, slots=True)
class Resources:
    """An amount of the four resources the scheduler counts (cpu in millicores, memory in bytes)."""

    cpu_milli: int = 0
    memory: int = 0
    gpu: int = 0
    pods: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu_milli + other.cpu_milli,
            self.memory + other.memory,
            self.gpu + other.gpu,
            self.pods + other.pods,
        )

    def __sub__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu_milli - other.cpu_milli,
            self.memory - other.memory,
            self.gpu - other.gpu,
            self.pods - other.pods,
        )

    def covers(self, other: Resources) -> bool:
        """True when every amount here is at least the one in ``other``."""
        return (
            self.cpu_milli >= other.cpu_milli
            and self.memory >= other.memory
            and self.gpu >= other.gpu
            and self.pods >= other.pods
        )


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = TaintEffect.NO_SCHEDULE.value


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod toleration; empty ``key`` with operator Exists tolerates everything."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.value == taint.value


@dataclass(frozen=True, slots=True)
class SelectorRequirement:
    """One ``matchExpressions`` entry of a node selector term."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Gt, Lt
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        op = self.operator
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if op in ("Gt", "Lt") and value is not None and len(self.values) == 1:
            try:
                have, want = int(value), int(self.values[0])
            except ValueError:
                return False
            return have > want if op == "Gt" else have < want
        return False


@dataclass(frozen=True, slots=True)
class SelectorTerm:
    """A node selector term: all requirements must hold (an empty term matches nothing)."""

    requirements: tuple[SelectorRequirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return bool(self.requirements) and all(r.matches(labels) for r in self.requirements)


@dataclass(frozen=True, slots=True)
class Node:
    name: NodeName
    labels: Mapping[str, str]
    allocatable: Resources
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    spot: bool = False
    #: From ``shoal.dev/gpu-topology``; ``None`` means count-only placement on this node.
    gpu_topology: GpuTopology | None = None


class PodPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What a pod asks for, and where it is (``node`` is empty while it is unbound)."""

    key: PodKey
    namespace: str
    name: str
    uid: str
    requests: Resources
    scheduler_name: str = ""
    node: NodeName | None = None
    phase: PodPhase = PodPhase.PENDING
    priority: int = 0
    #: Creation time, seconds since the epoch.
    created: float = 0.0
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    #: Required node affinity: the pod fits a node when any term matches (empty = no constraint).
    affinity: tuple[SelectorTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    deleting: bool = False
    #: ``spec.schedulingGates`` is not empty: nobody may schedule the pod yet.
    gated: bool = False

    @property
    def finished(self) -> bool:
        return self.phase in (PodPhase.SUCCEEDED, PodPhase.FAILED)

    @property
    def holds_resources(self) -> bool:
        """A bound pod that has not finished still occupies its node."""
        return self.node is not None and not self.finished


@dataclass(frozen=True, slots=True)
class Gang:
    """Pods admitted together: at least ``min_member`` at once, then up to ``max_member``.

    ``members`` are the gang's pods that have not finished, bound or not, in a stable order.
    """

    key: GangKey
    namespace: str
    name: str
    min_member: int
    max_member: int
    members: tuple[PodRequest, ...]
    priority: int = 0
    created: float = 0.0
    topology_required: str | None = None
    topology_preferred: str | None = None
    #: Set when the gang comes from a PodGroup object (``namespace/name``); ``None`` for labels.
    pod_group: str | None = None
    #: Members bound (or assumed) to a node, and members waiting for one; derived.
    bound: tuple[PodRequest, ...] = field(init=False, compare=False)
    pending: tuple[PodRequest, ...] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "bound", tuple(p for p in self.members if p.node is not None))
        object.__setattr__(
            self,
            "pending",
            tuple(p for p in self.members if p.node is None and not p.deleting and not p.gated),
        )

    @property
    def min_missing(self) -> int:
        """How many more members must be bound for the gang to reach its minimum."""
        return max(0, self.min_member - len(self.bound))

    @property
    def surplus_room(self) -> int:
        """How many more members may be bound before the gang reaches its maximum."""
        return max(0, self.max_member - len(self.bound))


@dataclass(frozen=True, slots=True)
class Assignment:
    pod: PodKey
    node: NodeName


@dataclass(frozen=True, slots=True)
class Placement:
    """Where each placed member goes; ``domains`` counts distinct values per topology key."""

    gang: GangKey
    assignments: tuple[Assignment, ...]
    domains: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Unschedulable:
    """Why a gang (or some of its members) could not be placed, kube-scheduler style.

    ``reasons`` counts nodes by the first filter that refused them ("Insufficient
    nvidia.com/gpu" -> 12). ``summary`` is a sentence about the gang as a whole when the reason
    is not per node (too few members, no single rack large enough).
    """

    nodes_total: int
    reasons: Mapping[str, int] = field(default_factory=dict)
    summary: str = ""

    def message(self) -> str:
        parts = ", ".join(f"{count} {reason}" for reason, count in _by_count(self.reasons))
        head = f"0/{self.nodes_total} nodes are available"
        text = f"{head}: {parts}." if parts else f"{head}."
        return f"{self.summary} {text}".strip() if self.summary else text


def _by_count(reasons: Mapping[str, int]) -> list[tuple[str, int]]:
    return sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))


@dataclass(frozen=True, slots=True)
class InvalidGang:
    """A gang whose definition is wrong; ``message`` names the field and the offending value."""

    key: GangKey
    namespace: str
    name: str
    message: str
    members: tuple[PodRequest, ...] = ()
    pod_group: str | None = None


@dataclass(frozen=True, slots=True)
class PodGroup:
    """A ``scheduling.x-k8s.io/v1alpha1`` PodGroup as read from the API, not yet validated.

    ``min_member`` keeps the raw value so that a wrong one can be reported, not lost.
    """

    namespace: str
    name: str
    min_member: object
    annotations: Mapping[str, str] = field(default_factory=dict)
    created: float = 0.0
    uid: str = ""


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node with what its bound and assumed pods already use.

    ``islands`` is the number of free GPUs in each NVLink island (``None`` when the node has no
    ``shoal.dev/gpu-topology``); see :mod:`scheduler.topology` for how it is accounted.
    ``free`` is computed once: allocatable minus requested, with GPUs capped by the islands.
    """

    node: Node
    requested: Resources
    islands: tuple[int, ...] | None = None
    free: Resources = field(init=False, compare=False)

    def __post_init__(self) -> None:
        free = self.node.allocatable - self.requested
        if self.islands is not None:
            gpu = min(free.gpu, sum(self.islands))
            free = Resources(free.cpu_milli, free.memory, gpu, free.pods)
        object.__setattr__(self, "free", free)

    @property
    def name(self) -> NodeName:
        return self.node.name
