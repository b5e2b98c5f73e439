"""Cache with assume/forget and cheap snapshots; see the package docstring for the state machine."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from contracts import names
from scheduler import topology
from scheduler.gang.build import gang_of
from scheduler.model import (
    Assignment,
    GangKey,
    Node,
    NodeName,
    NodesOrigin,
    NodeState,
    PodGroup,
    PodKey,
    PodRequest,
    Resources,
)
from scheduler.topology.domains import EMPTY, DomainIndex, Domains


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One consistent view: node states with bound and assumed pods charged, every pod, groups."""

    nodes: Mapping[NodeName, NodeState]
    pods: Mapping[PodKey, PodRequest]
    pod_groups: Mapping[str, PodGroup]
    #: ``pods`` grouped by gang (unordered, finished ones included); a group's tuple is the
    #: same object from one snapshot to the next while none of its pods changed. ``None`` in
    #: snapshots derived inside a cycle.
    members: Mapping[GangKey, tuple[PodRequest, ...]] | None = None
    #: Free capacity per topology domain of ``nodes`` (the keys the cache tracks).
    domains: Domains = EMPTY
    #: The cache snapshot's nodes this one derives from and the names changed since (``None``:
    #: this is the cache snapshot, its own root; see :attr:`origin`).
    derived: NodesOrigin | None = None

    @property
    def origin(self) -> NodesOrigin:
        """Where ``nodes`` come from, for the placement search (``place(..., origin=)``)."""
        return self.derived if self.derived is not None else NodesOrigin(self.nodes)

    def _derive(self, changes: Iterable[tuple[NodeState | None, NodeState | None]]) -> NodesOrigin:
        """This snapshot's origin, with the nodes of ``changes`` touched too."""
        origin = self.origin
        return NodesOrigin(
            origin.root, origin.touched.union(old.name for old, _ in changes if old is not None)
        )

    def with_assignments(self, assignments: Iterable[Assignment]) -> Snapshot:
        """The snapshot after binding ``assignments`` (used inside one cycle)."""
        nodes = dict(self.nodes)
        pods = dict(self.pods)
        changes: list[tuple[NodeState | None, NodeState | None]] = []
        for a in assignments:
            pod = dataclasses.replace(pods[a.pod], node=a.node)
            pods[a.pod] = pod
            state = nodes[a.node]
            islands = state.islands
            if islands is not None:
                islands = topology.take(islands, pod.requests.gpu)
            nodes[a.node] = NodeState(state.node, state.requested + pod.requests, islands)
            changes.append((state, nodes[a.node]))
        return Snapshot(
            nodes,
            pods,
            self.pod_groups,
            domains=self.domains.moved(changes),
            derived=self._derive(changes),
        )

    def with_reserved(self, reserved: Iterable[tuple[NodeName, Resources]]) -> Snapshot:
        """The snapshot with room held on nodes (for a gang whose victims are leaving)."""
        nodes = dict(self.nodes)
        changes: list[tuple[NodeState | None, NodeState | None]] = []
        for name, amount in reserved:
            state = nodes.get(name)
            if state is None:
                continue
            islands = state.islands
            if islands is not None:
                islands = topology.take(islands, amount.gpu)
            nodes[name] = NodeState(state.node, state.requested + amount, islands)
            changes.append((state, nodes[name]))
        if not changes:
            return self
        return Snapshot(
            nodes,
            self.pods,
            self.pod_groups,
            domains=self.domains.moved(changes),
            derived=self._derive(changes),
        )

    def without(self, keys: Iterable[PodKey]) -> Snapshot:
        """The snapshot as if the pods ``keys`` had left their nodes."""
        gone = set(keys)
        touched = {self.pods[k].node for k in gone if k in self.pods}
        touched.discard(None)
        if not touched:
            return self
        nodes = dict(self.nodes)
        staying: dict[NodeName, list[PodRequest]] = {n: [] for n in touched if n is not None}
        for pod in self.pods.values():
            if pod.node in staying and pod.key not in gone and pod.holds_resources:
                staying[pod.node].append(pod)
        changes: list[tuple[NodeState | None, NodeState | None]] = []
        for name, pods in staying.items():
            if name in nodes:
                old = nodes[name]
                nodes[name] = node_state(old.node, pods)
                changes.append((old, nodes[name]))
        return Snapshot(
            nodes,
            {k: p for k, p in self.pods.items() if k not in gone},
            self.pod_groups,
            domains=self.domains.moved(changes),
            derived=self._derive(changes),
        )


class Cache:
    def __init__(
        self,
        *,
        assume_ttl: float = 60.0,
        topology_keys: Iterable[str] = names.DEFAULT_TOPOLOGY_KEYS,
    ) -> None:
        self._lock = threading.Lock()
        self._assume_ttl = assume_ttl
        self._nodes: dict[NodeName, Node] = {}
        self._pods: dict[PodKey, PodRequest] = {}  # as the API server last told us
        # node, deadline, and the pod as assumed (the same object in every snapshot, so that
        # consumers can tell "unchanged" by identity).
        self._assumed: dict[PodKey, tuple[NodeName, float, PodRequest]] = {}
        self._on_node: dict[NodeName, dict[PodKey, PodRequest]] = {}
        self._states: dict[NodeName, NodeState] = {}
        self._groups: dict[str, PodGroup] = {}
        # Pods as snapshots show them (assumed ones on their node), grouped by gang; the groups
        # changed since the last snapshot are rebuilt then.
        self._gang_of: dict[PodKey, GangKey] = {}
        self._by_gang: dict[GangKey, dict[PodKey, PodRequest]] = {}
        self._gang_tuples: dict[GangKey, tuple[PodRequest, ...]] = {}
        self._dirty: set[GangKey] = set()
        # Free capacity per topology domain: each node counted with the state it had when last
        # snapshotted (``_counted``), moved to its new state when a snapshot recomputes it.
        self._domains = DomainIndex(topology_keys)
        self._counted: dict[NodeName, NodeState] = {}

    # -- nodes ---------------------------------------------------------------------------------
    def set_node(self, node: Node) -> None:
        with self._lock:
            self._nodes[node.name] = node
            self._states.pop(node.name, None)

    def remove_node(self, name: NodeName) -> None:
        with self._lock:
            self._nodes.pop(name, None)
            self._states.pop(name, None)
            self._uncount(name)

    def has_node(self, name: NodeName) -> bool:
        """The node exists as the API server last told us (checked again just before a bind:
        a node deleted after the decision must not receive the pod)."""
        with self._lock:
            return name in self._nodes

    def replace_nodes(self, nodes: Iterable[Node]) -> None:
        """After a relist: exactly these nodes exist."""
        with self._lock:
            self._nodes = {n.name: n for n in nodes}
            self._states.clear()
            for name in [n for n in self._counted if n not in self._nodes]:
                self._uncount(name)

    # -- pods ----------------------------------------------------------------------------------
    def set_pod(self, pod: PodRequest) -> PodRequest | None:
        """Record ``pod`` as the API server shows it; returns what was recorded before."""
        with self._lock:
            old = self._pods.get(pod.key)
            self._set_pod(pod)
            self._index(pod.key)
            return old

    def remove_pod(self, key: PodKey) -> None:
        with self._lock:
            self._detach(key)
            self._pods.pop(key, None)
            self._assumed.pop(key, None)
            self._index(key)

    def replace_pods(self, pods: Iterable[PodRequest]) -> None:
        """After a relist: exactly these pods exist (assumed ones stay assumed if still there)."""
        with self._lock:
            fresh = {p.key: p for p in pods}
            for key in list(self._pods):
                if key not in fresh:
                    self._detach(key)
                    self._pods.pop(key)
                    self._assumed.pop(key, None)
                    self._index(key)
            for pod in fresh.values():
                self._set_pod(pod)
                self._index(pod.key)

    def assume(self, assignments: Iterable[Assignment], now: float) -> None:
        with self._lock:
            for a in assignments:
                pod = self._pods.get(a.pod)
                if pod is None or pod.node is not None:
                    continue
                self._detach(a.pod)
                placed = dataclasses.replace(pod, node=a.node)
                self._assumed[a.pod] = (a.node, now + self._assume_ttl, placed)
                self._attach(placed)
                self._index(a.pod)

    def forget(self, key: PodKey) -> None:
        """Undo an assume (the binding failed); a pod already seen bound is left alone."""
        with self._lock:
            self._forget(key)

    def expire(self, now: float) -> list[PodKey]:
        """Forget assumptions that no watch event confirmed before their deadline."""
        with self._lock:
            stale = [k for k, (_, deadline, _) in self._assumed.items() if deadline <= now]
            for key in stale:
                self._forget(key)
            return stale

    def assumed(self) -> dict[PodKey, NodeName]:
        with self._lock:
            return {k: node for k, (node, _, _) in self._assumed.items()}

    # -- pod groups ----------------------------------------------------------------------------
    def overcommitted(self, name: NodeName) -> Resources | None:
        """How much more than node ``name`` has its pods are counted for (an in-place resize
        not yet applied is counted at the largest of its sizes), or ``None`` when it holds them
        all or is not known."""
        with self._lock:
            node = self._nodes.get(name)
            if node is None:
                return None
            used = Resources()
            for pod in self._on_node.get(name, {}).values():
                used = used + pod.requests
            over = used - node.allocatable
            if over.cpu_milli <= 0 and over.memory <= 0 and over.gpu <= 0:
                return None
            return Resources(max(0, over.cpu_milli), max(0, over.memory), max(0, over.gpu), 0)

    def set_pod_group(self, group: PodGroup) -> None:
        with self._lock:
            self._groups[group.ref] = group

    def remove_pod_group(self, key: str) -> None:
        with self._lock:
            self._groups.pop(key, None)

    def replace_pod_groups(self, groups: Iterable[PodGroup], kind: str = "") -> None:
        """The PodGroups of the kind tagged ``kind`` are now ``groups`` (those of other kinds
        stay)."""
        with self._lock:
            kept = {k: g for k, g in self._groups.items() if g.kind != kind}
            self._groups = kept | {g.ref: g for g in groups}

    # -- snapshot ------------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        with self._lock:
            for name, node in self._nodes.items():
                if name not in self._states:
                    state = self._states[name] = self._state(node)
                    self._domains.update(self._counted.get(name), state)
                    self._counted[name] = state
            pods = dict(self._pods)
            for key, (_, _, placed) in self._assumed.items():
                if key in pods:
                    pods[key] = placed
            for gang in self._dirty:
                members = self._by_gang.get(gang)
                if members:
                    self._gang_tuples[gang] = tuple(members.values())
                else:
                    self._gang_tuples.pop(gang, None)
            self._dirty.clear()
            return Snapshot(
                dict(self._states),
                pods,
                dict(self._groups),
                dict(self._gang_tuples),
                self._domains.view(),
            )

    # -- internals (lock held) -----------------------------------------------------------------
    def _uncount(self, name: NodeName) -> None:
        old = self._counted.pop(name, None)
        if old is not None:
            self._domains.update(old, None)

    def _forget(self, key: PodKey) -> None:
        if key not in self._assumed:
            return
        self._detach(key)
        del self._assumed[key]
        pod = self._pods.get(key)
        if pod is not None:
            self._attach(pod)
        self._index(key)

    def _set_pod(self, pod: PodRequest) -> None:
        self._detach(pod.key)
        self._pods[pod.key] = pod
        assumed = self._assumed.get(pod.key)
        if assumed is not None and pod.node is None and not pod.finished:
            # Still in flight: keep charging the assumed node with the fresh pod object.
            placed = dataclasses.replace(pod, node=assumed[0])
            self._assumed[pod.key] = (assumed[0], assumed[1], placed)
            self._attach(placed)
            return
        self._assumed.pop(pod.key, None)
        self._attach(pod)

    def _attach(self, pod: PodRequest) -> None:
        if pod.holds_resources and pod.node is not None:
            self._on_node.setdefault(pod.node, {})[pod.key] = pod
            self._states.pop(pod.node, None)

    def _detach(self, key: PodKey) -> None:
        assumed = self._assumed.get(key)
        pod = self._pods.get(key)
        for node in {assumed[0] if assumed else None, pod.node if pod else None}:
            if node is not None and key in self._on_node.get(node, {}):
                del self._on_node[node][key]
                if not self._on_node[node]:
                    # Nodes come and go (spot, autoscaling): keep no entry for an empty one.
                    del self._on_node[node]
                self._states.pop(node, None)

    def _index(self, key: PodKey) -> None:
        """File the pod ``key`` (as snapshots show it) under its gang, after any change."""
        old = self._gang_of.pop(key, None)
        if old is not None:
            members = self._by_gang.get(old)
            if members is not None:
                members.pop(key, None)
                if not members:
                    del self._by_gang[old]
            self._dirty.add(old)
        pod = self._pods.get(key)
        if pod is None:
            return
        assumed = self._assumed.get(key)
        shown = assumed[2] if assumed is not None else pod
        gang = gang_of(shown)[0]
        self._gang_of[key] = gang
        self._by_gang.setdefault(gang, {})[key] = shown
        self._dirty.add(gang)

    def _state(self, node: Node) -> NodeState:
        return node_state(node, self._on_node.get(node.name, {}).values())


def node_state(node: Node, pods: Iterable[PodRequest]) -> NodeState:
    """A node with ``pods`` (the ones holding resources on it) charged."""
    ordered = sorted(pods, key=lambda p: p.key)
    requested = Resources()
    for pod in ordered:
        requested = requested + pod.requests
    islands = None
    if node.gpu_topology is not None:
        islands = topology.free_islands(
            node.gpu_topology, ((str(p.key), p.requests.gpu) for p in ordered)
        )
    return NodeState(node, requested, islands)
