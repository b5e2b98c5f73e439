"""Plain values for the scheduler's unit tests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from contracts import gputopology, names
from scheduler.cache import Cache, Snapshot
from scheduler.model import (
    Node,
    NodeName,
    PodGroup,
    PodKey,
    PodRequest,
    Resources,
    Taint,
    Toleration,
)

SCHED = names.SCHEDULER_NAME
GIB = 1024**3


def node(
    name: str,
    *,
    gpus: int = 8,
    cpu: int = 96,
    memory_gib: int = 1024,
    pods: int = 110,
    rack: str | None = "rack-0",
    zone: str | None = "zone-a",
    spot: bool = False,
    island_size: int | None = None,
    allocated: Mapping[int, str] | None = None,
    taints: tuple[Taint, ...] = (),
    unschedulable: bool = False,
    labels: Mapping[str, str] | None = None,
) -> Node:
    all_labels = {"kubernetes.io/hostname": name, **(labels or {})}
    if rack is not None:
        all_labels[names.RACK_LABEL] = rack
    if zone is not None:
        all_labels[names.ZONE_LABEL] = zone
    if spot:
        all_labels[names.CAPACITY_TYPE_LABEL] = "spot"
    topo = None
    if island_size is not None:
        topo = gputopology.uniform(gpus, island_size, node_name=name)
        if allocated:
            topo = gputopology.GpuTopology(
                gpus=topo.gpus, links=topo.links, allocated=dict(allocated)
            )
    return Node(
        name=NodeName(name),
        labels=all_labels,
        allocatable=Resources(cpu * 1000, memory_gib * GIB, gpus, pods),
        taints=taints,
        unschedulable=unschedulable,
        spot=spot,
        gpu_topology=topo,
    )


def pod(
    name: str,
    *,
    namespace: str = "ns",
    gpus: int = 1,
    cpu_milli: int = 1000,
    gang: str | None = None,
    pod_group: str | None = None,
    min_member: str | None = None,
    max_member: str | None = None,
    priority: int = 0,
    created: float = 0.0,
    node: str | None = None,
    scheduler: str = SCHED,
    annotations: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    tolerations: tuple[Toleration, ...] = (),
) -> PodRequest:
    labels: dict[str, str] = {}
    notes = dict(annotations or {})
    if gang is not None:
        labels[names.GANG_LABEL] = gang
    if pod_group is not None:
        labels[names.POD_GROUP_LABEL] = pod_group
    if min_member is not None:
        notes[names.MIN_MEMBER_ANNOTATION] = min_member
    if max_member is not None:
        notes[names.MAX_MEMBER_ANNOTATION] = max_member
    return PodRequest(
        key=PodKey(f"{namespace}/{name}"),
        namespace=namespace,
        name=name,
        uid=f"uid-{name}",
        requests=Resources(cpu_milli, GIB, gpus, 1),
        scheduler_name=scheduler,
        node=NodeName(node) if node else None,
        priority=priority,
        created=created,
        labels=labels,
        annotations=notes,
        node_selector=dict(node_selector or {}),
        tolerations=tolerations,
    )


def group(name: str, min_member: object, *, namespace: str = "ns", **notes: str) -> PodGroup:
    return PodGroup(namespace=namespace, name=name, min_member=min_member, annotations=notes)


def snapshot(
    nodes: Iterable[Node], pods: Iterable[PodRequest] = (), groups: Iterable[PodGroup] = ()
) -> Snapshot:
    cache = Cache()
    for n in nodes:
        cache.set_node(n)
    for p in pods:
        cache.set_pod(p)
    for g in groups:
        cache.set_pod_group(g)
    return cache.snapshot()
