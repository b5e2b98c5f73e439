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

The pods that are waiting count too (``waiting``: the shapes of other gangs' minimums that wait
for room, with how many of each). Losing one of ``hosts`` nodes that hold a waiting shape
costs its GPUs times ``min(1, waiting / hosts)``: nothing much while many nodes hold it, the
whole pod once there are no more hosts than waiting pods (each host lost is then a waiting pod
that cannot go).

The likely shapes are read from the cluster itself, so that the score needs nothing but the
nodes it places on: for every GPU node shape (allocatable CPU, memory and GPUs) and every
power-of-two GPU count up to its GPUs, the pod asking for that share of the node (2 GPUs of an
8-GPU, 96-CPU node: 2 GPUs and 24 CPUs), weighted by how many nodes have that shape. The
whole-node pods of the scarce big shapes are then in the workload, and the plentiful shapes
weigh the most.

When the pods that arrived are known (``learned``: :class:`scheduler.placement.shapes.Likely`,
the shapes a :class:`~scheduler.placement.shapes.ShapeLedger` counted), they are added, weighing
:data:`LEARNED_WEIGHT` in all beside the node shapes' 1 (so that what the node shapes keep for
the scarce big shapes is kept as before). A share of a node asks for as
much CPU per GPU as the node has; the pods that come may ask for more (a 1-GPU pod asking 18
CPUs, on nodes of 12 CPUs per GPU), and a placement that leaves a free GPU with less CPU or
memory beside it than they ask for then costs what losing a host of their shape costs: nothing
much while many nodes hold it, much once few do.

:func:`demand_of` keeps the node shape counts and the hosts per likely shape between calls, per
node state object (a call re-reads only the nodes whose state changed, as the cache hands
unchanged nodes over as the same objects); the shapes a free amount holds are memoised. Like
the filters' memo it is used by one scheduling thread at a time, and what it returns is what
counting every node would give (a unit test compares the two).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from scheduler.model import Node, NodeName, NodeState, Resources
from scheduler.placement.shapes import Likely, Shape

#: Waiting pods, as (requests, how many), of other gangs whose minimum waits for room.
Waiting = Sequence[tuple[Resources, int]]

#: What a demand is made for besides the nodes: the waiting shapes (with how many of each) and
#: the learned shapes (with their shares).
_Asked = tuple[tuple[tuple[Shape, int], ...], tuple[tuple[Shape, float], ...]]

_MEMO_LIMIT: Final = 50_000
#: At most this many waiting and learned shapes are kept tracked between calls (beyond it, only
#: the ones asked for last).
_EXTRA_LIMIT: Final = 64
#: What the learned shapes weigh in all, beside the node shapes' 1.
LEARNED_WEIGHT: Final = 1.0


def shape_of(node: Node) -> Shape:
    a = node.allocatable
    return (a.cpu_milli, a.memory, a.gpu)


class Demand:
    """The expected workload on one nodes mapping: pod ``shapes`` ``(cpu, memory, gpus)`` with
    their ``weights`` (summing to 1, plus :data:`LEARNED_WEIGHT` with learned shapes),
    ``hosts``: how many nodes each shape fits on now, and ``nodes``: how many nodes have each
    node shape; ``waiting``: per shape, how many pods of it wait (the waiting shapes are among
    ``shapes``, with weight 0 unless also likely or learned)."""

    __slots__ = (
        "_cost",
        "_masks",
        "_per_bit",
        "hosts",
        "nodes",
        "shapes",
        "total",
        "waiting",
        "weights",
    )

    def __init__(
        self,
        shapes: tuple[Shape, ...],
        weights: tuple[float, ...],
        hosts: list[int],
        nodes: Mapping[Shape, int],
        masks: dict[tuple[int, int, int], int],
        *,
        waiting: Sequence[int] = (),
    ) -> None:
        self.shapes = shapes
        self.weights = weights
        self.hosts = hosts
        self.nodes = nodes
        self.total = sum(nodes.values())
        self.waiting = tuple(waiting) or (0,) * len(shapes)
        self._masks = masks
        self._cost: dict[int, float] = {}
        self._per_bit: list[float | None] = [None] * len(shapes)

    def mask(self, cpu: int, memory: int, gpu: int) -> int:
        """The shapes (one bit each) that fit a node with this much free."""
        return _mask(self.shapes, self._masks, cpu, memory, gpu)

    def lost(self, request: Resources, free: Resources) -> int:
        """The shapes (one bit each) a node with ``free`` holds before ``request`` is placed on
        it and not after."""
        return self.mask(free.cpu_milli, free.memory, free.gpu) & ~self.mask(
            free.cpu_milli - request.cpu_milli,
            free.memory - request.memory,
            free.gpu - request.gpu,
        )

    def cost(self, request: Resources, free: Resources) -> float:
        """What placing ``request`` on a node with ``free`` left costs the likely pods: for each
        shape the node could hold before and cannot after, its weight over the number of nodes
        that hold it now (in nodes' worth of the whole cluster)."""
        lost = self.lost(request, free)
        if not lost:
            return 0.0
        known = self._cost.get(lost)
        if known is not None:
            return known
        value = 0.0
        bit = 0
        while lost >> bit:
            if lost >> bit & 1:
                value += self.loss(bit)
            bit += 1
        self._cost[lost] = value
        return value

    def charge(self, lost: int, taken: dict[int, int]) -> float:
        """What losing the shapes ``lost`` costs after the hosts in ``taken`` (per shape, hosts
        lost to the members placed before, in the same placement) are gone, and counts this
        loss in ``taken``: each member of a gang pays against the hosts the members before it
        left, so that taking the last hosts of a shape costs more than taking the first."""
        value = 0.0
        bit = 0
        while lost >> bit:
            if lost >> bit & 1:
                before = taken.get(bit, 0)
                if before:
                    value += self._loss_at(bit, self.hosts[bit] - before)
                else:
                    value += self.loss(bit)
                taken[bit] = before + 1
            bit += 1
        return value

    def loss(self, bit: int) -> float:
        """What losing one host of shape ``bit`` costs: its share of the likely GPUs over its
        hosts (in nodes' worth of the cluster), plus, when pods of it wait, its GPUs times the
        share of its hosts the waiting pods need (at most all of them)."""
        known = self._per_bit[bit]
        if known is None:
            known = self._per_bit[bit] = self._loss_at(bit, self.hosts[bit])
        return known

    def _loss_at(self, bit: int, hosts: int) -> float:
        hosts = max(hosts, 1)
        gpus = self.shapes[bit][2]
        value = self.weights[bit] * gpus / hosts * self.total
        if self.waiting[bit]:
            value += gpus * min(1.0, self.waiting[bit] / hosts)
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
    """Node shape counts and, per likely (or waiting) pod shape, the nodes it fits on, kept per
    node state between calls: a call re-reads only the nodes whose state object changed."""

    __slots__ = (
        "counts",
        "demand",
        "extra",
        "hosts",
        "index",
        "known",
        "masks",
        "shapes",
        "weights",
    )

    def __init__(self) -> None:
        self.known: dict[NodeName, tuple[NodeState, int]] = {}
        self.counts: dict[Shape, int] = {}
        self.shapes: tuple[Shape, ...] = ()
        self.index: dict[Shape, int] = {}
        self.weights: tuple[float, ...] = ()
        self.hosts: list[int] = []
        self.masks: dict[tuple[int, int, int], int] = {}
        #: Waiting and learned shapes tracked beside the likely ones.
        self.extra: frozenset[Shape] = frozenset()
        #: The last demand handed out, and the waiting pods and learned shapes it was for.
        self.demand: tuple[_Asked, Demand] | None = None

    def _rebuild(self, nodes: Mapping[NodeName, NodeState]) -> None:
        counts: dict[Shape, int] = {}
        for state in nodes.values():
            shape = shape_of(state.node)
            counts[shape] = counts.get(shape, 0) + 1
        likely = likely_shapes(counts)
        whole = sum(likely.values()) or 1.0
        self.counts = counts
        self.shapes = tuple(sorted(likely)) + tuple(sorted(self.extra - likely.keys()))
        self.index = {shape: bit for bit, shape in enumerate(self.shapes)}
        self.weights = tuple(likely.get(s, 0.0) / whole for s in self.shapes)
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

    def _track(self, wanted: Sequence[Shape]) -> bool:
        """Make sure every waiting and learned shape is tracked; true when the shapes
        changed."""
        new = {shape for shape in wanted if shape not in self.index}
        if not new:
            return False
        extra = self.extra | new
        if len(extra) > _EXTRA_LIMIT:
            extra = frozenset(wanted)
        self.extra = frozenset(extra)
        return True

    def _mixed(self, shares: tuple[tuple[Shape, float], ...]) -> tuple[float, ...]:
        """The node shapes' weights, with the learned ``shares`` added, weighing
        :data:`LEARNED_WEIGHT` in all."""
        if not shares:
            return self.weights
        mixed = list(self.weights)
        for shape, share in shares:
            mixed[self.index[shape]] += LEARNED_WEIGHT * share
        return tuple(mixed)

    def update(
        self,
        nodes: Mapping[NodeName, NodeState],
        waiting: Waiting = (),
        learned: Likely | None = None,
    ) -> Demand:
        waits = _waiting_shapes(waiting)
        shares = learned.shapes if learned is not None else ()
        asked = (waits, shares)
        wanted = [shape for shape, _ in waits] + [shape for shape, _ in shares]
        known = self.known
        changed = self.demand is None or self._track(wanted)
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
            self._track(wanted)
            self._rebuild(nodes)
        if self.demand is None or self.demand[0] != asked:
            counts = [0] * len(self.shapes)
            for shape, count in waits:
                counts[self.index[shape]] += count
            demand = Demand(
                self.shapes,
                self._mixed(shares),
                list(self.hosts),
                self.counts,
                self.masks,
                waiting=counts,
            )
            self.demand = (asked, demand)
        return self.demand[1]


def _waiting_shapes(waiting: Waiting) -> tuple[tuple[Shape, int], ...]:
    """The waiting pods that ask for GPUs, as node-shape-like tuples, merged and in order."""
    merged: dict[Shape, int] = {}
    for requests, count in waiting:
        if requests.gpu > 0 and count > 0:
            shape = (requests.cpu_milli, requests.memory, requests.gpu)
            merged[shape] = merged.get(shape, 0) + count
    return tuple(sorted(merged.items()))


_TRACKER = _Tracker()


def demand_of(
    nodes: Mapping[NodeName, NodeState], waiting: Waiting = (), learned: Likely | None = None
) -> Demand:
    """The expected workload on the cluster ``nodes`` make up, as it stands, with the pods of
    ``waiting`` (requests, how many) counted as waiting for room and, with ``learned``, the
    shapes that arrived added to it (:data:`LEARNED_WEIGHT`)."""
    return _TRACKER.update(nodes, waiting, learned)
