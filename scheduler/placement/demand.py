"""What a placement costs the pods likely to come: the FGD idea, adapted to whole GPUs and gangs.

Fragmentation Gradient Descent (Weng et al., "Beware of Fragmentation", USENIX ATC '23) scores a
node by what a placement takes from the pods expected to arrive, weighted by how often they come.
Here GPUs are whole, so what a placement can take from a pod shape is a node that could hold it:
a node holds a shape while its free CPU, memory and GPUs all cover it. A placement costs, for
every likely shape the node held before and does not after,

    weight(shape) * gpus(shape) / hosts(shape)   (times the number of nodes)

where ``hosts`` is how many nodes hold the shape now: losing one of 600 hosts of a shape costs
little, losing one of the 39 nodes that alone hold the biggest pods costs much, and losing the
last one costs the shape's whole weight. The count is over the whole cluster, not the one node
scored (FGD's own measure looks at one node at a time, and would send a mid-size pod to the
node with the most CPU and memory per GPU, which keeps the most room on that node — the scarce
node the biggest pods need). A placement that takes nothing a likely shape could use costs 0:
filling a node already too small for the big shapes is free.

The likely shapes are read from the cluster itself, so that the score needs nothing but the
nodes it places on: for every GPU node shape (allocatable CPU, memory and GPUs) and every
power-of-two GPU count up to its GPUs, the pod asking for that share of the node (2 GPUs of an
8-GPU, 96-CPU node: 2 GPUs and 24 CPUs), weighted by how many nodes have that shape. The
whole-node pods of the scarce big shapes are then in the workload, and the plentiful shapes
weigh the most.

:func:`demand_of` keeps the node shape counts and the hosts per likely shape between calls, per
node state object (a call re-reads only the nodes whose state changed, as the cache hands
unchanged nodes over as the same objects); the shapes a free amount holds are memoised. Like
the filters' memo it is used by one scheduling thread at a time, and what it returns is what
counting every node would give (a unit test compares the two).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from scheduler.model import Node, NodeName, NodeState, Resources

#: A node shape: allocatable CPU (millicores), memory (bytes), GPUs.
Shape = tuple[int, int, int]

_MEMO_LIMIT: Final = 50_000


def shape_of(node: Node) -> Shape:
    a = node.allocatable
    return (a.cpu_milli, a.memory, a.gpu)


class Demand:
    """The expected workload on one nodes mapping: pod ``shapes`` ``(cpu, memory, gpus)`` with
    their ``weights`` (summing to 1), ``hosts``: how many nodes each shape fits on now, and
    ``nodes``: how many nodes have each node shape."""

    __slots__ = ("_cost", "_masks", "hosts", "nodes", "shapes", "total", "weights")

    def __init__(
        self,
        shapes: tuple[Shape, ...],
        weights: tuple[float, ...],
        hosts: list[int],
        nodes: Mapping[Shape, int],
        masks: dict[tuple[int, int, int], int],
    ) -> None:
        self.shapes = shapes
        self.weights = weights
        self.hosts = hosts
        self.nodes = nodes
        self.total = sum(nodes.values())
        self._masks = masks
        self._cost: dict[int, float] = {}

    def mask(self, cpu: int, memory: int, gpu: int) -> int:
        """The shapes (one bit each) that fit a node with this much free."""
        return _mask(self.shapes, self._masks, cpu, memory, gpu)

    def cost(self, request: Resources, free: Resources) -> float:
        """What placing ``request`` on a node with ``free`` left costs the likely pods: for each
        shape the node could hold before and cannot after, its weight over the number of nodes
        that hold it now (in nodes' worth of the whole cluster)."""
        lost = self.mask(free.cpu_milli, free.memory, free.gpu) & ~self.mask(
            free.cpu_milli - request.cpu_milli,
            free.memory - request.memory,
            free.gpu - request.gpu,
        )
        if not lost:
            return 0.0
        known = self._cost.get(lost)
        if known is not None:
            return known
        value = 0.0
        hosts, shapes, weights, bit = self.hosts, self.shapes, self.weights, 0
        while lost >> bit:
            if lost >> bit & 1:
                value += weights[bit] * shapes[bit][2] / max(hosts[bit], 1)
            bit += 1
        value *= self.total
        self._cost[lost] = value
        return value

    def plenty(self, node: Node) -> float:
        """The share of the cluster's nodes that have ``node``'s shape."""
        return self.nodes.get(shape_of(node), 0) / self.total if self.total else 0.0


def likely_shapes(nodes: Mapping[Shape, int]) -> dict[Shape, float]:
    """The pod shapes read from the node shapes, and their weights (see the module docstring)."""
    shapes: dict[Shape, float] = {}
    for (cpu, memory, gpus), count in nodes.items():
        if gpus <= 0 or count <= 0:
            continue
        size = 1
        while size <= gpus:
            shape = (cpu * size // gpus, memory * size // gpus, size)
            shapes[shape] = shapes.get(shape, 0.0) + count
            size *= 2
    return shapes


def _mask(
    shapes: tuple[Shape, ...],
    memo: dict[tuple[int, int, int], int],
    cpu: int,
    memory: int,
    gpu: int,
) -> int:
    if gpu <= 0:
        return 0
    key = (cpu, memory, gpu)
    known = memo.get(key)
    if known is not None:
        return known
    mask = 0
    for bit, (s_cpu, s_memory, s_gpu) in enumerate(shapes):
        if s_gpu <= gpu and s_cpu <= cpu and s_memory <= memory:
            mask |= 1 << bit
    if len(memo) >= _MEMO_LIMIT:
        memo.clear()
    memo[key] = mask
    return mask


class _Tracker:
    """Node shape counts and, per likely pod shape, the nodes it fits on, kept per node state
    between calls: a call re-reads only the nodes whose state object changed."""

    __slots__ = ("counts", "demand", "hosts", "known", "masks", "shapes", "weights")

    def __init__(self) -> None:
        self.known: dict[NodeName, tuple[NodeState, int]] = {}
        self.counts: dict[Shape, int] = {}
        self.shapes: tuple[Shape, ...] = ()
        self.weights: tuple[float, ...] = ()
        self.hosts: list[int] = []
        self.masks: dict[tuple[int, int, int], int] = {}
        self.demand: Demand | None = None

    def _rebuild(self, nodes: Mapping[NodeName, NodeState]) -> None:
        counts: dict[Shape, int] = {}
        for state in nodes.values():
            shape = shape_of(state.node)
            counts[shape] = counts.get(shape, 0) + 1
        likely = likely_shapes(counts)
        whole = sum(likely.values()) or 1.0
        self.counts = counts
        self.shapes = tuple(sorted(likely))
        self.weights = tuple(likely[s] / whole for s in self.shapes)
        self.hosts = [0] * len(self.shapes)
        self.masks = {}
        self.known = {}
        self.demand = None
        for name, state in nodes.items():
            self._add(name, state)

    def _add(self, name: NodeName, state: NodeState) -> None:
        free = state.free
        mask = _mask(self.shapes, self.masks, free.cpu_milli, free.memory, free.gpu)
        self.known[name] = (state, mask)
        bit = 0
        while mask >> bit:
            if mask >> bit & 1:
                self.hosts[bit] += 1
            bit += 1

    def _remove(self, mask: int) -> None:
        bit = 0
        while mask >> bit:
            if mask >> bit & 1:
                self.hosts[bit] -= 1
            bit += 1

    def update(self, nodes: Mapping[NodeName, NodeState]) -> Demand:
        known = self.known
        changed = self.demand is None
        if not changed:
            for name, state in nodes.items():
                old = known.get(name)
                if old is not None and old[0] is state:
                    continue
                if old is None or shape_of(old[0].node) != shape_of(state.node):
                    changed = True  # a node came or changed shape: the likely shapes may too
                    break
                self._remove(old[1])
                self._add(name, state)
                self.demand = None
            if len(known) != len(nodes):  # a node left
                changed = True
        if changed:
            self._rebuild(nodes)
        if self.demand is None:
            self.demand = Demand(
                self.shapes, self.weights, list(self.hosts), self.counts, self.masks
            )
        return self.demand


_TRACKER = _Tracker()


def demand_of(nodes: Mapping[NodeName, NodeState]) -> Demand:
    """The expected workload on the cluster ``nodes`` make up, as it stands."""
    return _TRACKER.update(nodes)
