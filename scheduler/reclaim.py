"""Reclaim: whom to ask to leave so that a waiting gang's minimum fits. Pure.

Victims come in units, tried in this order:

1. surplus members (bound above their gang's minimum) of gangs with lower or equal priority —
   lowest priority first, then least expected loss first (:mod:`scheduler.loss`: GPU-seconds
   since the last complete checkpoint plus the restart cost; unknown losses after the known
   ones), then youngest member first; a gang is never taken below its minimum here, and which
   of its members are its surplus is chosen by the same order;
2. whole gangs (every bound member) of strictly lower priority — lowest priority first, then
   least total loss (unknown when any member's is), then youngest gang first. A gang is broken
   below its minimum only by evicting it whole.

Units are added one at a time until the gang's minimum fits on the snapshot without them; then
every unit that is not needed for the fit is dropped again (last added first), so the result is
a set of victims none of which could be spared. Pods of other schedulers are never victims.
Each victim comes with why it was chosen (:attr:`Plan.why`: its loss, its place among the
candidates), which its Event says.

Victims already asked to leave (*spent*, for this gang or another one) are never chosen again:
the plan counts them as gone, with the room held for the gangs they leave for still charged
(``held``), and a gang's minimum can never lean on the members they take from theirs. Pods
already deleting (``deletionTimestamp`` set: evicted, deleted by their controller, by a user,
or by Kueue stopping a preempted workload) count the same way, whoever scheduled them: their
room is coming, and taking another pod for it would be one victim too many. When that room
alone is enough, the plan has no victims: the gang waits for it (:attr:`Plan.leaving` and
:attr:`Plan.terminating` say which pods it waits for). Otherwise it adds units of its own as
above, counting that room as free.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from scheduler import topology
from scheduler.cache import node_state
from scheduler.cache.cache import Snapshot
from scheduler.loss import Loss, ProgressCost, VictimCost
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
#: The live victim cost (``shoal.dev/progress`` and a 60 s restart).
DEFAULT_COST = ProgressCost()


@dataclass(frozen=True, slots=True)
class Plan:
    #: New victims to ask to leave (none: the room of the pods already leaving is enough).
    victims: tuple[PodKey, ...]
    #: Where the gang's minimum goes once the victims have left (held for it until then).
    placement: Placement
    #: Why each victim was chosen (its expected loss and rank), for its Event.
    why: Mapping[PodKey, str] = field(default_factory=dict)
    #: Pods already asked to leave (spent) on the placement's nodes: room the plan counts on.
    leaving: tuple[PodKey, ...] = ()
    #: Pods already deleting on the placement's nodes, not asked by Shoal: room it counts on too.
    terminating: tuple[PodKey, ...] = ()


def plan(
    gang: Gang,
    gangs: Sequence[Gang],
    snapshot: Snapshot,
    request: Request,
    *,
    spent: Collection[PodKey] = (),
    held: Iterable[tuple[NodeName, Resources]] = (),
    cost: VictimCost = DEFAULT_COST,
    now: float = 0.0,
) -> Plan | None:
    """Victims that make ``request`` (the gang's minimum) fit, or ``None`` when none can.

    ``spent`` are pods already asked to leave (never victims again, counted as gone), and so
    are the pods of ``snapshot`` already deleting; ``held`` is the room ``snapshot`` already
    charges for other gangs, which stays charged on the nodes that victims leave; ``cost``
    ranks victims by their loss at ``now``."""
    wanted = list(request.pods)
    if not wanted:
        return None
    spent = frozenset(spent)
    useful = _useful_nodes(snapshot, wanted[0])
    units = _units(gang, gangs, useful, spent, _Costs(cost, now))
    asked = {k for k in spent if k in snapshot.pods and snapshot.pods[k].node in useful}
    deleting = _deleting(snapshot, useful) - asked
    freeing = asked | deleting
    if not units and not freeing:
        return None
    occupancy = _Occupancy.of(snapshot, freeing, held)
    if freeing:
        waits = place(request, occupancy.nodes_without(set()))
        if isinstance(waits, Placement):
            return _waiting(waits, snapshot, asked, deleting)
    if not units:
        return None
    fit = _add_until_fit(request, [u.keys for u in units], occupancy)
    if fit is None:
        return None
    gone, placement = _drop_unneeded(request, fit, occupancy)
    counted = _waiting(placement, snapshot, asked, deleting)
    return Plan(
        tuple(sorted(gone)),
        placement,
        _reasons(gone, units),
        counted.leaving,
        counted.terminating,
    )


def _deleting(snapshot: Snapshot, useful: set[NodeName]) -> set[PodKey]:
    """Bound pods of any scheduler already deleting on ``useful`` nodes: their room is coming."""
    return {
        key
        for key, pod in snapshot.pods.items()
        if pod.deleting and pod.holds_resources and pod.node in useful
    }


def _waiting(
    placement: Placement, snapshot: Snapshot, asked: set[PodKey], deleting: set[PodKey]
) -> Plan:
    """A plan with no victims: ``placement`` once the leaving pods on its nodes are gone."""
    nodes = {a.node for a in placement.assignments}

    def there(keys: set[PodKey]) -> tuple[PodKey, ...]:
        return tuple(sorted(k for k in keys if snapshot.pods[k].node in nodes))

    return Plan((), placement, leaving=there(asked), terminating=there(deleting))


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


@dataclass(frozen=True, slots=True)
class _Unit:
    """Victims taken together (one surplus member, or a whole gang) and what they lose."""

    keys: tuple[PodKey, ...]
    loss: Loss
    priority: int
    #: "surplus member" or "whole gang".
    kind: str
    #: Creation time and name: among equal losses, the youngest is taken first.
    young: tuple[float, str] = (0.0, "")


@dataclass(slots=True)
class _Costs:
    """The loss of each pod at ``now``, computed once per plan."""

    cost: VictimCost
    now: float
    seen: dict[PodKey, Loss] = field(default_factory=dict)

    def of(self, pod: PodRequest) -> Loss:
        loss = self.seen.get(pod.key)
        if loss is None:
            loss = self.seen[pod.key] = self.cost(pod, self.now)
        return loss

    def total(self, pods: Sequence[PodRequest]) -> Loss:
        losses = [self.of(p) for p in pods]
        known = [loss.gpu_seconds for loss in losses if loss.gpu_seconds is not None]
        if len(known) < len(losses):
            return Loss(None, gpus=sum(loss.gpus for loss in losses))
        return Loss(sum(known), gpus=sum(loss.gpus for loss in losses))


def _by_loss(pods: Sequence[PodRequest], costs: _Costs) -> list[PodRequest]:
    """Least expected loss first; among equal losses, youngest first (the later name first
    among pods created in the same second)."""
    youngest = sorted(pods, key=lambda p: (p.created, p.name), reverse=True)
    return sorted(youngest, key=lambda p: costs.of(p).rank())


def _units(
    gang: Gang,
    gangs: Sequence[Gang],
    useful: set[NodeName],
    spent: Collection[PodKey],
    costs: _Costs,
) -> list[_Unit]:
    """Victim units in the order they are tried; a gang's spent members are gone already (they
    are no unit, and its surplus is what stays above its minimum without them)."""
    surplus: list[_Unit] = []
    whole: list[_Unit] = []
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
            cheapest = [p for p in _by_loss(bound, costs) if p.node in useful][:extra]
            surplus.extend(
                _Unit((p.key,), costs.of(p), other.priority, "surplus member", (p.created, p.key))
                for p in cheapest
            )
        if other.priority < gang.priority:
            keys = tuple(p.key for p in bound)
            young = (other.created, other.key)
            whole.append(_Unit(keys, costs.total(bound), other.priority, "whole gang", young))
    return (_ordered(surplus) + _ordered(whole))[:MAX_UNITS]


def _ordered(units: list[_Unit]) -> list[_Unit]:
    """Lowest priority first, then least loss, then youngest (stable sorts, last key first)."""
    units.sort(key=lambda u: u.young, reverse=True)
    units.sort(key=lambda u: (u.priority, u.loss.rank()))
    return units


def _reasons(gone: Collection[PodKey], units: Sequence[_Unit]) -> dict[PodKey, str]:
    """Why each victim was taken: its unit's loss, its place in the order, the next candidate
    left alone."""
    taken = [i for i, u in enumerate(units) if any(k in gone for k in u.keys)]
    spared = next((u for u in units if not any(k in gone for k in u.keys)), None)
    after = (
        f"; the next candidate spared, {', '.join(spared.keys)}, would lose {spared.loss.text()}"
        if spared is not None
        else ""
    )
    why: dict[PodKey, str] = {}
    for i in taken:
        unit = units[i]
        text = (
            f"chosen by least expected loss as {unit.kind} {i + 1} of {len(units)} candidates "
            f"(priority {unit.priority}): {unit.loss.text()}{after}"
        )
        for key in unit.keys:
            why.setdefault(key, text)
    return why
