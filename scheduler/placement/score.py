"""Score plugins: how good is a node for one more member of a gang? Higher is better.

Pure and additive; the weights say what wins over what:

1. NVLink island (``ISLAND``): a multi-GPU pod on a node whose free GPUs include one island large
   enough for the whole pod beats any node where it would straddle islands.
2. Capacity type (``CAPACITY``): the minimum quorum prefers on-demand nodes, surplus members
   prefer spot, so that a revocation takes elastic members first.
3. Domain affinity (``TOGETHER``): a node in a rack the gang already uses beats a new rack.
4. Tight fit (``TIGHT``, per GPU left free): pack GPUs so whole nodes stay free for big pods;
   pods without GPUs keep off GPU nodes.
5. Stranding (``STRAND``, per GPU): a GPU node's free GPUs need their share of its CPU and
   memory. A GPU counts as stranded while the share of CPU (or memory) left free is below the
   share of GPUs left free; the score charges the GPUs a placement strands (and credits those it
   puts back to use). A CPU-only pod then goes where the GPUs are already busy instead of eating
   the CPU that free GPUs will need, and a GPU pod prefers a node whose free GPUs were short of
   CPU anyway.
6. Rest (``REST``): among equals, the node whose CPU and memory end up fuller.
7. Plenty (``PLENTIFUL``): among equals, the node whose shape (allocatable CPU, memory, GPUs)
   the most nodes share, so that the scarce shapes are kept for the pods only they can hold.

Beside the tight fit, on the same scale (GPUs), comes what the placement costs the pods likely
to come (``FRAGMENT``; :mod:`scheduler.placement.demand`, the FGD idea adapted to whole GPUs):
the likely pod shapes the node could hold before and cannot after, each weighted by its share
of the likely GPUs over the number of nodes that still hold it. It keeps the nodes that alone
hold the biggest shapes for last, and fills first the nodes the big shapes could not use anyway.
It and ``PLENTIFUL`` are off in a ``Weights`` that does not ask for them (the simulator's
best-fit and least-allocated) and on in :data:`DEFAULT_WEIGHTS` (Shoal's).

Ties left after all of this (nodes of one shape with as much free) are broken by a hash of pod
and node name in the search, never by name order (which would pile every small pod onto the
first nodes).

Fewest topology domains is decided before scoring, by the search (one rack when one rack holds
the gang); see :mod:`scheduler.placement.search`.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler import topology
from scheduler.model import Node, Resources


@dataclass(frozen=True, slots=True)
class Weights:
    island: float = 1000.0
    capacity: float = 100.0
    together: float = 50.0
    tight: float = 1.0
    strand: float = 1.0
    rest: float = 0.1
    #: Off unless asked for, so that a policy spelled out term by term (the simulator's
    #: best-fit, least-allocated) stays what it says.
    fragment: float = 0.0
    plentiful: float = 0.0
    #: Per GPU a gang leaves free in the domain it is placed in, when the search compares the
    #: domains that hold it (:meth:`scheduler.placement.search._Search.first_fit`).
    domain_left: float = 0.0


#: Shoal's placement.
DEFAULT_WEIGHTS = Weights(fragment=1.0, plentiful=0.01, domain_left=1.0)


def island_fit(islands: tuple[int, ...] | None, gpus: int) -> bool:
    """True when one NVLink island on the node has ``gpus`` free GPUs (or the node is flat)."""
    if gpus <= 1 or islands is None:
        return True
    return topology.best_island(islands, gpus) is not None


def node_score(
    request: Resources,
    node: Node,
    free: Resources,
    islands: tuple[int, ...] | None,
    *,
    surplus: bool,
    together: bool,
    weights: Weights = DEFAULT_WEIGHTS,
    fragment: float = 0.0,
    plenty: float = 0.0,
) -> float:
    """Score of placing a pod asking ``request`` on ``node`` that has ``free`` left.
    ``fragment`` is what it costs the likely pods (:meth:`~scheduler.placement.demand.Demand.cost`),
    ``plenty`` the share of nodes with the node's shape."""
    score = -weights.fragment * fragment + weights.plentiful * plenty
    if request.gpu > 1 and islands is not None and island_fit(islands, request.gpu):
        score += weights.island
    if node.spot == surplus:
        score += weights.capacity
    if together:
        score += weights.together
    if request.gpu > 0:
        score -= weights.tight * (free.gpu - request.gpu)
    elif node.allocatable.gpu > 0:
        score -= weights.tight * node.allocatable.gpu
    left = free - request
    score -= weights.strand * (stranded(node.allocatable, left) - stranded(node.allocatable, free))
    score -= weights.rest * (
        _share(left.cpu_milli, node.allocatable.cpu_milli)
        + _share(left.memory, node.allocatable.memory)
    )
    return score


def stranded(allocatable: Resources, free: Resources) -> float:
    """How many of the free GPUs lack their share of CPU or memory (fractional): 0 on a node
    without GPUs or whose CPU and memory run out no faster than its GPUs."""
    if allocatable.gpu <= 0:
        return 0.0
    gpus = _share(free.gpu, allocatable.gpu)
    other = min(
        _share(free.cpu_milli, allocatable.cpu_milli), _share(free.memory, allocatable.memory)
    )
    return max(0.0, gpus - other) * allocatable.gpu


def _share(amount: int, whole: int) -> float:
    return amount / whole if whole > 0 else 0.0
