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
#: ``namespace/name`` of a gang (the PodGroup's or the ``shoal.dev/gang`` label's name),
#: ``namespace/volcano/<name>`` or ``namespace/k8s/<name>`` for a Volcano or Kubernetes
#: PodGroup, or ``namespace/pod:<name>`` for a pod that is a gang of one.
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
        """Whether the labels satisfy this requirement; an unknown operator matches nothing."""
        value = labels.get(self.key)
        match self.operator:
            case "In":
                return value is not None and value in self.values
            case "NotIn":
                return value is None or value not in self.values
            case "Exists":
                return value is not None
            case "DoesNotExist":
                return value is None
            case "Gt" | "Lt":
                return _compares_as_integer(self.operator, value, self.values)
            case _:
                return False


def _compares_as_integer(operator: str, value: str | None, values: tuple[str, ...]) -> bool:
    """``Gt``/``Lt``: one value given, it and the label both integers, the label greater (less).

    Anything else (no label, several values, a non-integer) does not match.
    """
    if value is None or len(values) != 1:
        return False
    try:
        have, want = int(value), int(values[0])
    except ValueError:
        return False
    return have > want if operator == "Gt" else have < want


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
    #: Why the node is expected to go soon, from its agent's ``shoal.dev/revocation`` when
    #: every notice there is not disruptive (a rebalance recommendation, a scheduled
    #: maintenance); "" when none (:mod:`scheduler.early_warning`).
    early_warning: str = ""


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
    #: ``spec.priorityClassName`` ("" when none).
    priority_class: str = ""
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
    #: ``metadata.resourceVersion`` as read: status writes made on the strength of this view
    #: of the pod carry it as a precondition, so they never overwrite a newer state (a binding).
    resource_version: str = ""
    #: ``spec.schedulingGroup.podGroupName``: the Kubernetes (``scheduling.k8s.io``) PodGroup
    #: the pod belongs to, "" when none.
    scheduling_group: str = ""

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
    #: That PodGroup's uid: Events name it, so that ``kubectl describe podgroup`` shows them.
    pod_group_uid: str = ""
    #: What users should hear once about that PodGroup (a field of it Shoal does not act on).
    pod_group_notice: str = ""
    #: Pods of the gang that finished with success (not members any more): a gang with some is
    #: finishing its work, not torn.
    succeeded: int = 0
    #: Members bound (or assumed) to a node, and members waiting for one; derived.
    bound: tuple[PodRequest, ...] = field(init=False, compare=False)
    pending: tuple[PodRequest, ...] = field(init=False, compare=False)
    #: How many more members must be bound for the gang to reach its minimum; derived.
    min_missing: int = field(init=False, compare=False)
    #: How many more members may be bound before the gang reaches its maximum; derived.
    surplus_room: int = field(init=False, compare=False)

    def __post_init__(self) -> None:
        # Computed once: every cycle reads these for every gang.
        bound = tuple(p for p in self.members if p.node is not None)
        object.__setattr__(self, "bound", bound)
        object.__setattr__(
            self,
            "pending",
            tuple(p for p in self.members if p.node is None and not p.deleting and not p.gated),
        )
        object.__setattr__(self, "min_missing", max(0, self.min_member - len(bound)))
        object.__setattr__(self, "surplus_room", max(0, self.max_member - len(bound)))


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
    #: False when the nodes were never tried (the gang lacks members, or could not be read):
    #: the message then is the summary alone, with no "0/N nodes are available".
    nodes_tried: bool = True
    #: True when the gang only lacks members (it waits for them to be created; nothing is
    #: wrong yet): told with a Normal Event, not a FailedScheduling warning.
    waiting: bool = False

    def message(self) -> str:
        if not self.nodes_tried and self.summary:
            return self.summary
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
    pod_group_uid: str = ""
    #: The ``reason`` of the members' condition and the Event.
    reason: str = "InvalidGang"


def group_ref(tag: str, namespace: str, name: str) -> str:
    """How gangs, the cache and status writes name a PodGroup of the kind tagged ``tag``
    (:mod:`scheduler.gang.kinds`): ``namespace/name`` for the kind without a tag
    (scheduler-plugins'), ``namespace/<tag>/name`` for the others, ``namespace/volcano/name``
    say (object names hold no ``/``, so these never collide)."""
    return f"{namespace}/{name}" if not tag else f"{namespace}/{tag}/{name}"


def split_group_ref(ref: str) -> tuple[str, str, str]:
    """``(tag, namespace, name)`` of a :func:`group_ref`."""
    parts = ref.split("/")
    if len(parts) == 3:
        return parts[1], parts[0], parts[2]
    namespace, name = ref.split("/", 1)
    return "", namespace, name


@dataclass(frozen=True, slots=True)
class PodGroup:
    """A PodGroup as read from the API, not yet validated, of the kind whose tag is ``kind``
    (:mod:`scheduler.gang.kinds`; "": scheduler-plugins' ``scheduling.x-k8s.io``).

    ``min_member`` keeps the raw value so that a wrong one can be reported, not lost (Volcano's
    ``spec.minMember``, Kubernetes' ``spec.schedulingPolicy.gang.minCount``).
    """

    namespace: str
    name: str
    min_member: object
    annotations: Mapping[str, str] = field(default_factory=dict)
    created: float = 0.0
    uid: str = ""
    #: ``status.phase`` and ``status.scheduleStartTime`` as stored ("" and ``None`` when unset).
    phase: str = ""
    schedule_start: float | None = None
    kind: str = ""
    #: The API version the object was read in (status writes use it).
    version: str = ""
    #: Volcano ``spec.minTaskMember``: the least member pods per task name (raw values).
    min_task_member: Mapping[str, object] = field(default_factory=dict)
    #: ``spec.priorityClassName``, and that class's value once known (``None``: not known).
    priority_class: str = ""
    priority: int | None = None
    #: Volcano ``spec.queue`` ("" when none): Shoal has no queues and says so once.
    queue: str = ""

    @property
    def ref(self) -> str:
        return group_ref(self.kind, self.namespace, self.name)


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


@dataclass(frozen=True, slots=True)
class NodesOrigin:
    """Where a snapshot's nodes mapping comes from: ``root``, the nodes of the cache snapshot
    it was derived from inside a cycle (bindings, room held, pods gone), and ``touched``, the
    names whose state differs from ``root`` (a name may also have left). The placement search
    uses it to re-filter only those nodes (:mod:`scheduler.placement.fits`)."""

    root: Mapping[NodeName, NodeState]
    touched: frozenset[NodeName] = frozenset()
