"""Which nodes a pod fits on by itself, per pod shape, kept across the decisions of a cycle.

A cycle decides up to a batch of gangs on one cache snapshot, each on the snapshot the decisions
before it left (:mod:`scheduler.cycle`), and each placement search starts by filtering every
node for every distinct pod shape (its requests, selector, affinity, tolerations). Between two
decisions only the few nodes that took a pod change, so the verdicts for a shape are kept here
with the nodes mapping they were made on, and a search on a mapping derived from the same cache
snapshot (:class:`scheduler.model.NodesOrigin`) re-filters only the names either of the two
touched. A new cache snapshot (a new ``root``) filters every node once more.

What a search gets is exactly what filtering every node would give: per shape, the set of
nodes it fits on and, per node it does not fit on, the first filter's reason. The unit tests
compare the two after random changes. The memo is bounded (:data:`_SHAPES`), and used by one
scheduling thread at a time, like the static verdicts in :mod:`scheduler.placement.filters`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Final

from scheduler.model import NodeName, NodesOrigin, NodeState, PodRequest
from scheduler.placement import filters


class Fits:
    """The verdicts for one pod shape on one nodes mapping: ``fits`` holds the nodes a pod of
    that shape fits on by itself, ``refused`` the reason each other node gives."""

    __slots__ = ("fits", "nodes", "origin", "refused")

    def __init__(self, nodes: Mapping[NodeName, NodeState], origin: NodesOrigin | None) -> None:
        self.nodes = nodes
        self.origin = origin
        self.fits: set[NodeName] = set()
        self.refused: dict[NodeName, str] = {}

    def judge(self, pod: PodRequest, constraints: Hashable, names: Iterable[NodeName]) -> None:
        """(Re-)filter ``names`` against ``self.nodes``; a name no longer there is dropped."""
        static = filters.static_verdicts(constraints)
        request = pod.requests
        pods, cpu, memory = max(request.pods, 1), request.cpu_milli, request.memory
        gpu = request.gpu
        nodes, fits, refused = self.nodes, self.fits, self.refused
        for name in names:
            state = nodes.get(name)
            if state is None:
                fits.discard(name)
                refused.pop(name, None)
                continue
            known = static.get(name)
            if known is not None and known[0] is state.node:
                reason = known[1]
            else:
                reason = filters.first_static_failure(pod, state)
                static[name] = (state.node, reason)
            if reason is None:
                # filters.resources_fit, inlined for the common case (it fits).
                free = state.free
                if (
                    free.pods >= pods
                    and free.cpu_milli >= cpu
                    and free.memory >= memory
                    and free.gpu >= gpu
                ):
                    fits.add(name)
                    refused.pop(name, None)
                    continue
                reason = filters.resources_fit(request, free) or filters.TOO_MANY_PODS
            fits.discard(name)
            refused[name] = reason


#: Per pod shape, the newest verdicts. Bounded: cleared when it holds too many shapes.
_MEMO: dict[Hashable, Fits] = {}
_SHAPES: Final = 64


def fits_of(
    pod: PodRequest,
    shape: Hashable,
    constraints: Hashable,
    nodes: Mapping[NodeName, NodeState],
    origin: NodesOrigin | None,
) -> Fits:
    """The verdicts for pods of ``shape`` (``pod`` is one of them) on ``nodes``.

    With an ``origin``, the memo's verdicts for the same root are brought up to date by
    re-filtering the names touched since the root by either mapping; without one (a mapping
    made outside a cycle's lineage), every node is filtered and nothing is kept."""
    if origin is None:
        fresh = Fits(nodes, None)
        fresh.judge(pod, constraints, nodes)
        return fresh
    known = _MEMO.get(shape)
    if known is not None and known.nodes is nodes:
        return known
    if known is not None and known.origin is not None and known.origin.root is origin.root:
        known.nodes = nodes
        redo = known.origin.touched | origin.touched
        known.origin = origin
        known.judge(pod, constraints, redo)
        return known
    if len(_MEMO) >= _SHAPES:
        _MEMO.clear()
    fresh = _MEMO[shape] = Fits(nodes, origin)
    fresh.judge(pod, constraints, nodes)
    return fresh
