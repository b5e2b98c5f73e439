"""Reclaim: whom to ask to leave so that a waiting gang's minimum fits. Pure.

Victims come in units, tried in this order:

1. surplus members (bound above their gang's minimum) of gangs with lower or equal priority —
   lowest priority first, youngest member first; a gang is never taken below its minimum here;
2. whole gangs (every bound member) of strictly lower priority — lowest priority first,
   youngest gang first. A gang is broken below its minimum only by evicting it whole.

Units are added one at a time until the gang's minimum fits on the snapshot without them; then
every unit that is not needed for the fit is dropped again (last added first), so the result is
a set of victims none of which could be spared. Pods of other schedulers are never victims.

Victims already asked to leave (*spent*, for this gang or another one) are never chosen again:
the plan counts them as gone, with the room held for the gangs they leave for still charged
(``held``), and a gang's minimum can never lean on the members they take from theirs. When
that room alone is enough, the plan has no victims: the gang waits for it. Otherwise it adds
units of its own as above.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from scheduler import topology
from scheduler.cache import node_state
from scheduler.cache.cache import Snapshot
from scheduler.model import (
    Gang,
    NodeName,
    NodeState,
    Placement,
    PodKey,
    PodRequest,
    Resources,
    Unschedulable,
)
from scheduler.placement import Request, filters, place

#: Reclaim looks at no more units than this per attempt (bounded work per cycle).
MAX_UNITS = 256


@dataclass(frozen=True, slots=True)
class Plan:
    #: New victims to ask to leave (none: the room spent victims will free is enough).
    victims: tuple[PodKey, ...]
    #: Where the gang's minimum goes once the victims have left (held for it until then).
    placement: Placement


def plan(
    gang: Gang,
    gangs: Sequence[Gang],
    snapshot: Snapshot,
    request: Request,
    *,
    spent: Collection[PodKey] = (),
    held: Iterable[tuple[NodeName, Resources]] = (),
) -> Plan | None:
    """Victims that make ``request`` (the gang's minimum) fit, or ``None`` when none can.

    ``spent`` are pods already asked to leave (never victims again, counted as gone);
    ``held`` is the room ``snapshot`` already charges for other gangs, which stays charged
    on the nodes that victims leave."""
    wanted = list(request.pods)
    if not wanted:
        return None
    spent = frozenset(spent)
    useful = _useful_nodes(snapshot, wanted[0])
    units = _units(gang, gangs, useful, spent)
    freeing = {k for k in spent if k in snapshot.pods and snapshot.pods[k].node in useful}
    if not units and not freeing:
        return None
    occupancy = _Occupancy.of(snapshot, freeing, held)
    if freeing:
        waits = place(request, occupancy.nodes_without(set()))
        if isinstance(waits, Placement):
            return Plan((), waits)
    if not units:
        return None
    fit = _add_until_fit(request, units, occupancy)
    if fit is None:
        return None
    gone, placement = _drop_unneeded(request, fit, occupancy)
    return Plan(tuple(sorted(gone)), placement)


def _useful_nodes(snapshot: Snapshot, member: PodRequest) -> set[NodeName]:
    """Nodes that could ever take a member (labels, taints, cordon): only their pods help."""
    return {
        name
        for name, state in snapshot.nodes.items()
        if all(check(member, state) is None for check in filters.STATIC_FILTERS)
    }


@dataclass(frozen=True, slots=True)
class _Occupancy:
    """The snapshot's nodes and the pods holding resources on each, to take victims off; the
    pods already leaving (``spent``) are always off, the room held on a node always on."""

    snapshot: Snapshot
    by_node: Mapping[NodeName, Sequence[PodRequest]]
    spent: frozenset[PodKey]
    held: Mapping[NodeName, Sequence[Resources]]

    @classmethod
    def of(
        cls,
        snapshot: Snapshot,
        spent: Collection[PodKey] = (),
        held: Iterable[tuple[NodeName, Resources]] = (),
    ) -> _Occupancy:
        """Group the snapshot's bound pods that hold resources, and the held room, by node."""
        by_node: dict[NodeName, list[PodRequest]] = {}
        for pod in snapshot.pods.values():
            if pod.node is not None and pod.holds_resources:
                by_node.setdefault(pod.node, []).append(pod)
        leaving = frozenset(k for k in spent if k in snapshot.pods)
        charged: dict[NodeName, list[Resources]] = {}
        for name, amount in held:
            charged.setdefault(name, []).append(amount)
        return cls(snapshot, by_node, leaving, charged)

    def nodes_without(self, gone: set[PodKey]) -> Mapping[NodeName, NodeState]:
        """Every node as it would be once the ``gone`` and spent pods have left."""
        gone = gone | self.spent
        nodes = dict(self.snapshot.nodes)
        touched = {self.snapshot.pods[k].node for k in gone if k in self.snapshot.pods}
        for name in touched:
            if name is not None and name in nodes:
                staying = [p for p in self.by_node.get(name, []) if p.key not in gone]
                state = node_state(nodes[name].node, staying)
                nodes[name] = _charged(state, self.held.get(name, ()))
        return nodes


def _charged(state: NodeState, held: Sequence[Resources]) -> NodeState:
    """``state`` with the room held on it charged again (as the snapshot's view does)."""
    if not held:
        return state
    requested, islands = state.requested, state.islands
    for amount in held:
        requested = requested + amount
        if islands is not None:
            islands = topology.take(islands, amount.gpu)
    return NodeState(state.node, requested, islands)


@dataclass(frozen=True, slots=True)
class _Fit:
    """Units taken so far (in the order added), the pods in them, and where the gang goes."""

    chosen: list[tuple[PodKey, ...]]
    gone: set[PodKey]
    placement: Placement


def _add_until_fit(
    request: Request, units: Sequence[tuple[PodKey, ...]], occupancy: _Occupancy
) -> _Fit | None:
    """Take units in order until the minimum fits without them; ``None`` if it never does.

    A unit whose pods are all taken already (a surplus member of a gang taken whole) is skipped.
    """
    chosen: list[tuple[PodKey, ...]] = []
    gone: set[PodKey] = set()
    for unit in units:
        if all(k in gone for k in unit):
            continue
        chosen.append(unit)
        gone.update(unit)
        result = place(request, occupancy.nodes_without(gone))
        if isinstance(result, Placement):
            return _Fit(chosen, gone, result)
    return None


def _drop_unneeded(
    request: Request, fit: _Fit, occupancy: _Occupancy
) -> tuple[set[PodKey], Placement]:
    """Drop every unit the fit does not need, last added first (the last one is needed).

    A pod in two units (a surplus member whose whole gang was taken too) stays while any unit
    holding it stays.
    """
    chosen, gone, found = fit.chosen, fit.gone, fit.placement
    for unit in reversed(chosen[:-1]):
        rest = [u for u in chosen if u is not unit]
        trial = {key for u in rest for key in u}
        result = place(request, occupancy.nodes_without(trial))
        if not isinstance(result, Unschedulable):
            chosen, gone, found = rest, trial, result
    return gone, found


def _units(
    gang: Gang, gangs: Sequence[Gang], useful: set[NodeName], spent: Collection[PodKey]
) -> list[tuple[PodKey, ...]]:
    """Victim units in the order they are tried; a gang's spent members are gone already (they
    are no unit, and its surplus is what stays above its minimum without them)."""
    surplus: list[tuple[int, float, PodKey]] = []
    whole: list[tuple[int, float, tuple[PodKey, ...]]] = []
    for other in gangs:
        if other.key == gang.key:
            continue
        bound = [
            p for p in other.members if p.node is not None and not p.deleting and p.key not in spent
        ]
        if not bound or not any(p.node in useful for p in bound):
            continue
        extra = len(bound) - other.min_member
        if extra > 0 and other.priority <= gang.priority:
            # Youngest first; among pods created in the same second, the later name.
            youngest = sorted(bound, key=lambda p: (p.created, p.name), reverse=True)[:extra]
            surplus.extend((other.priority, p.created, p.key) for p in youngest if p.node in useful)
        if other.priority < gang.priority:
            whole.append((other.priority, other.created, tuple(p.key for p in bound)))
    # Lowest priority first, then youngest first (a stable sort on two keys).
    surplus.sort(key=lambda item: (item[1], item[2]), reverse=True)
    surplus.sort(key=lambda item: item[0])
    whole.sort(key=lambda item: (item[1], item[2]), reverse=True)
    whole.sort(key=lambda item: item[0])
    units: list[tuple[PodKey, ...]] = [(key,) for _, _, key in surplus]
    units.extend(keys for _, _, keys in whole)
    return units[:MAX_UNITS]
