"""One scheduling cycle: one gang, one snapshot, one decision. Pure.

The story of a cycle:

1. Take the first gang in queue order (priority, then age) that has work: pending members and
   an unmet minimum; only when none is ready, one with room below its maximum. A gang torn
   below its minimum (bound members, but fewer than the minimum: its scheduler died between two
   binds) comes before all of them unless it is backing off.
2. Minimum: if the gang still needs ``k`` members to reach its minimum, place exactly ``k`` pending
   members on the snapshot — all of them or none. Fewer than ``k`` pending pods means none is
   placed (no member ever waits bound for the rest of its gang: no Permit-style holding).
3. Surplus: then, and only if no other gang's minimum could be placed on what is left, place
   pending members one at a time up to the maximum, preferring spot capacity.
4. Reclaim: when a complete minimum does not fit, choose the fewest victims that make it fit
   (surplus first, see :mod:`scheduler.reclaim`) and the nodes to hold for the gang meanwhile.
   Pods already asked to leave are never chosen again: their room counts as free (less the
   room held for the gang they leave for), and a gang that fits in it waits for it; so does
   the room of pods already deleting, whoever asked them to go (a Kueue-preempted workload's
   pods, say: Kueue admits the preemptor while they are in their grace period). Gangs
   waiting for the same room thus take it in turn order: the first one its victims' room, the
   next its own victims, or the room that is left.

The caller binds what the decision says (after assuming it in the cache) and reports the
``Unschedulable`` status to the gang's pods; it records success or failure in the queue.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from contracts import names
from scheduler import reclaim
from scheduler.cache import Snapshot
from scheduler.loss import ProgressCost, VictimCost
from scheduler.model import (
    Assignment,
    Gang,
    GangKey,
    NodeName,
    Placement,
    PodKey,
    PodRequest,
    Resources,
    Unschedulable,
)
from scheduler.placement import Request, place
from scheduler.placement.risk import RiskLedger, member_bound, member_summary, quorum_bound
from scheduler.placement.score import DEFAULT_WEIGHTS, Weights
from scheduler.placement.shapes import Likely, ShapeLedger
from scheduler.queue import GangQueue, order_key


@dataclass(frozen=True, slots=True)
class Config:
    topology_keys: tuple[str, ...] = names.DEFAULT_TOPOLOGY_KEYS
    weights: Weights = field(default=DEFAULT_WEIGHTS)
    #: Ask surplus (then lower-priority gangs) to leave when a gang's minimum cannot fit.
    reclaim: bool = True
    #: What a victim would lose (reclaim takes the least first; the simulator's seam).
    victim_cost: VictimCost = field(default_factory=ProgressCost)
    #: Revocation rates per capacity pool, learned from the nodes each turn sees (a quorum goes
    #: to the lowest-risk capacity that holds it); ``None``: no risk-aware placement.
    risk: RiskLedger | None = field(default=None, compare=False)
    #: The pod shapes and gang sizes that arrived, counted from the gangs each turn sees: every
    #: placement counts what it takes from them (:mod:`scheduler.placement.shapes`); ``None``:
    #: only the node shapes' shares (``--arrived-shapes=false``).
    shapes: ShapeLedger | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Decision:
    """What one cycle decided for ``gang``.

    ``bindings`` lists the minimum quorum first (``min_count`` of them), then surplus members.
    ``unschedulable`` says why the minimum could not be placed (``None`` when it was, or was
    already met). ``surplus_held`` is true when surplus members waited because another gang's
    minimum fits in the room they would take. ``victims`` are the pods to ask to leave so that
    the minimum fits, at ``nominated`` (room to hold for this gang until it binds).
    """

    gang: Gang
    bindings: tuple[Assignment, ...] = ()
    min_count: int = 0
    unschedulable: Unschedulable | None = None
    surplus_held: bool = False
    victims: tuple[PodKey, ...] = ()
    nominated: tuple[Assignment, ...] = ()
    #: Why (the first) surplus member that did not fit did not fit.
    surplus_unschedulable: Unschedulable | None = None
    #: Why each victim was chosen (its expected loss and rank), for its Event.
    why: Mapping[PodKey, str] = field(default_factory=dict)
    #: Set when deciding for the gang raised (a fault, logged by the caller): the gang is
    #: treated as unschedulable and backs off; no other gang is affected.
    fault: str | None = None

    @property
    def progressed(self) -> bool:
        return bool(self.bindings)


def has_work(gang: Gang) -> bool:
    if not gang.pending:
        return False
    return gang.min_missing > 0 or gang.surplus_room > 0


def torn(gang: Gang) -> bool:
    """Some members are bound, but fewer than the minimum: finishing it comes before anything."""
    return bool(gang.bound) and gang.min_missing > 0


def waiting_for_members(gang: Gang) -> str:
    """What a gang whose minimum lacks members waits for, counting what is true."""
    bound, pending = len(gang.bound), len(gang.pending)
    missing = gang.min_missing - pending
    if bound:
        return (
            f"gang {gang.name}: {bound} of {gang.min_member} bound, {pending} pending; "
            f"waiting for {missing} more member(s) to reach its minimum."
        )
    return (
        f"gang {gang.name} has {pending} of the {gang.min_member} members its minimum needs; "
        f"waiting for {missing} more before any is bound."
    )


def min_waiting(gang: Gang) -> bool:
    """The gang's minimum is unmet and every pod it needs for it exists."""
    return gang.min_missing > 0 and len(gang.pending) >= gang.min_missing


def waiting_pods(
    others: Iterable[Gang], gang: Gang, skip: Collection[GangKey] = ()
) -> tuple[tuple[Resources, int], ...]:
    """The pods the other gangs' minimums wait with (those in ``skip`` were decided already),
    as (requests, how many): the placement counts what it would take from them."""
    counts: dict[Resources, int] = {}
    for other in others:
        if other.key == gang.key or other.key in skip or not min_waiting(other):
            continue
        for pod in other.pending[: other.min_missing]:
            counts[pod.requests] = counts.get(pod.requests, 0) + 1
    return tuple(counts.items())


def _request(
    gang: Gang,
    pods: Sequence[PodRequest],
    config: Config,
    *,
    surplus: bool,
    bound_nodes: Sequence[NodeName] | None = None,
    waiting: Sequence[tuple[Resources, int]] = (),
) -> Request:
    if bound_nodes is None:
        bound_nodes = [p.node for p in gang.bound if p.node is not None]
    bound = quorum_bound(gang.members)
    return Request(
        gang=gang.key,
        pods=pods,
        topology_keys=config.topology_keys,
        required=gang.topology_required,
        preferred=gang.topology_preferred,
        surplus=surplus,
        bound_nodes=tuple(bound_nodes),
        weights=config.weights,
        waiting=waiting,
        likely=config.shapes.likely() if config.shapes is not None else Likely(),
        revocation=config.risk.rates() if config.risk is not None else {},
        max_quorum_risk=bound if isinstance(bound, float) else None,
    )


def decide(
    gang: Gang,
    others: Iterable[Gang],
    snapshot: Snapshot,
    config: Config,
    decided: Collection[GangKey] = (),
) -> Decision:
    """The decision for ``gang`` on ``snapshot``; ``others`` are the other gangs with work
    (those in ``decided`` were already placed on ``snapshot`` and wait for nothing)."""
    pending = list(gang.pending)
    need = gang.min_missing
    bindings: list[Assignment] = []
    others = list(others)
    waiting = waiting_pods(others, gang, decided)
    per_member = _member_risk(gang, config)
    if isinstance(per_member, str):  # a bound that is not a chance: the gang waits, told why
        why = Unschedulable(len(snapshot.nodes), summary=f"{per_member};", nodes_tried=False)
        return Decision(gang, unschedulable=why)
    if need > 0:
        if len(pending) < need:
            return Decision(
                gang,
                unschedulable=Unschedulable(
                    len(snapshot.nodes),
                    summary=waiting_for_members(gang),
                    nodes_tried=False,
                    waiting=True,
                ),
            )
        result = place(
            _request(gang, pending[:need], config, surplus=False, waiting=waiting),
            snapshot.nodes,
            snapshot.domains,
            snapshot.origin,
        )
        if isinstance(result, Unschedulable):
            return Decision(gang, unschedulable=result)
        bindings.extend(result.assignments)
        snapshot = snapshot.with_assignments(result.assignments)
        pending = pending[need:]
    min_count = len(bindings)

    room = gang.surplus_room - min_count
    held = False
    surplus_why: Unschedulable | None = None
    if room > 0 and pending:
        held = _min_fits(others, gang, snapshot, config, decided)
        if not held:
            bound: list[NodeName] = [p.node for p in gang.bound if p.node is not None]
            bound.extend(a.node for a in bindings)
            for pod in pending[:room]:
                request = _request(
                    gang, [pod], config, surplus=True, bound_nodes=bound, waiting=waiting
                )
                one = _place_surplus(request, snapshot, per_member)
                if isinstance(one, Unschedulable):
                    surplus_why = surplus_why or one
                    continue
                bindings.extend(one.assignments)
                bound.extend(a.node for a in one.assignments)
                snapshot = snapshot.with_assignments(one.assignments)
    return Decision(
        gang, tuple(bindings), min_count, surplus_held=held, surplus_unschedulable=surplus_why
    )


def _member_risk(gang: Gang, config: Config) -> float | str | None:
    """The gang's bound on each surplus member's risk (``shoal.dev/max-member-risk``), or
    ``None``; the reason, as a string, when it or the quorum's bound is not a chance. Bounds
    need the learned rates: without risk-aware placement there are none."""
    if config.risk is None:
        return None
    quorum = quorum_bound(gang.members)
    return quorum if isinstance(quorum, str) else member_bound(gang.members)


def _place_surplus(
    request: Request, snapshot: Snapshot, bound: float | None
) -> Placement | Unschedulable:
    """One surplus member; with a ``bound`` on its risk, placed as a quorum of one is: on the
    lowest-risk capacity that holds it, and nowhere whose risk is above the bound."""
    if bound is not None:
        request = replace(request, surplus=False, max_quorum_risk=bound)
    one = place(request, snapshot.nodes, snapshot.domains, snapshot.origin)
    if isinstance(one, Unschedulable) and bound is not None:
        return replace(one, summary=member_summary(one.summary))
    return one


def replacements_fit(
    gang: Gang,
    pods: Sequence[PodRequest],
    snapshot: Snapshot,
    config: Config,
    bound_nodes: Sequence[NodeName],
) -> bool:
    """Whether ``pods``, replacements for surplus members of ``gang`` that are moving, all fit
    on ``snapshot`` as :func:`decide` would place them: one by one, on the lowest-risk capacity,
    within the gang's bound on each member's risk (``shoal.dev/max-member-risk``)."""
    per_member = _member_risk(gang, config)
    if isinstance(per_member, str):
        return False
    bound = list(bound_nodes)
    for pod in pods:
        request = _request(gang, [pod], config, surplus=True, bound_nodes=bound)
        one = _place_surplus(request, snapshot, per_member)
        if isinstance(one, Unschedulable):
            return False
        bound.extend(a.node for a in one.assignments)
        snapshot = snapshot.with_assignments(one.assignments)
    return True


@dataclass(frozen=True, slots=True)
class _Leaving:
    """What one gang's reclaim knows of the victims already asked to leave."""

    #: How many were asked to leave for this gang and are still there.
    own: int
    #: Every victim still there, for any gang: never chosen again, their room counts as free.
    spent: Collection[PodKey]
    #: The room held for the other gangs (charged on ``snapshot`` already).
    held: Sequence[tuple[NodeName, Resources]]


def _waiting_for(decision: Decision, summary: str) -> Decision:
    why = decision.unschedulable
    assert why is not None
    return replace(decision, unschedulable=Unschedulable(why.nodes_total, why.reasons, summary))


def _reclaim(
    decision: Decision,
    gangs: Sequence[Gang],
    snapshot: Snapshot,
    config: Config,
    leaving: _Leaving,
    *,
    now: float = 0.0,
) -> Decision:
    gang = decision.gang
    assert decision.unschedulable is not None
    if leaving.own:
        return _waiting_for(
            decision,
            f"waiting for {leaving.own} pod(s) asked to leave to make room for gang {gang.name};",
        )
    if not config.reclaim:
        return decision
    pods = list(gang.pending)[: gang.min_missing]
    request = _request(gang, pods, config, surplus=False)
    found = reclaim.plan(
        gang,
        gangs,
        snapshot,
        request,
        spent=leaving.spent,
        held=leaving.held,
        cost=config.victim_cost,
        now=now,
    )
    if found is None:
        return decision
    if not found.victims:
        return _waiting_for(decision, _room_coming(found))
    return replace(
        decision, victims=found.victims, nominated=found.placement.assignments, why=found.why
    )


def _room_coming(found: reclaim.Plan) -> str:
    """What a gang that waits for room already on its way waits for."""
    parts = []
    if found.leaving:
        parts.append(f"{len(found.leaving)} pod(s) asked to leave for other gangs")
    if found.terminating:
        parts.append(f"{len(found.terminating)} pod(s) already terminating")
    return f"waiting for the room {' and '.join(parts) or 'pods leaving'} will free;"


def _min_fits(
    others: Iterable[Gang],
    gang: Gang,
    snapshot: Snapshot,
    config: Config,
    skip: Collection[GangKey] = (),
) -> bool:
    for other in others:
        if other.key == gang.key or other.key in skip or not min_waiting(other):
            continue
        pods = list(other.pending)[: other.min_missing]
        found = place(
            _request(other, pods, config, surplus=False),
            snapshot.nodes,
            snapshot.domains,
            snapshot.origin,
        )
        if not isinstance(found, Unschedulable):
            return True
    return False


def _turn_key(gang: Gang) -> tuple[bool, bool, int, float, str]:
    """A gang torn below its minimum (its scheduler died between binds, or a bind failed)
    first: its bound members hold room until the rest joins them. Then minimums, surplus
    after (growth never delays someone's quorum); in queue order within each."""
    return (not torn(gang), gang.min_missing == 0, *order_key(gang))


def _in_turn(ready: list[Gang]) -> Iterator[Gang]:
    """``ready`` in turn order, lazily: a cycle takes a batch of them, not all, so a heap
    orders what it takes instead of sorting every gang."""
    heap = [(_turn_key(g), i, g) for i, g in enumerate(ready)]
    heapq.heapify(heap)
    while heap:
        yield heapq.heappop(heap)[2]


def _faulted(gang: Gang, nodes: int, exc: Exception) -> Decision:
    """The decision for a gang whose decision raised: nothing is placed, the gang backs off
    like one that did not fit, and its members are told (the cycle goes on with the others)."""
    fault = f"{type(exc).__name__}: {exc}"[:300]
    return Decision(
        gang,
        unschedulable=Unschedulable(
            nodes,
            summary=f"Shoal could not decide for gang {gang.name} ({fault}); "
            "it is retried after a backoff, the other gangs go on.",
            nodes_tried=False,
        ),
        fault=fault,
    )


def run_cycle(
    gangs: Sequence[Gang],
    queue: GangQueue,
    snapshot: Snapshot,
    now: float,
    config: Config,
    *,
    reserved: Mapping[GangKey, Sequence[tuple[NodeName, Resources]]] | None = None,
    leaving: Mapping[GangKey, int] | None = None,
    spent: Collection[PodKey] | None = None,
) -> Decision | None:
    """Decide for the first ready gang with work and record the outcome in ``queue``.

    ``reserved`` is room held for gangs whose victims are leaving (charged for every other
    gang); ``leaving`` counts, per gang, the victims asked to leave for it that are still there
    (no new victims are chosen for such a gang); ``spent`` are all those victims, whatever
    their gang (never chosen again; the room they free counts for the others). Returns
    ``None`` when no gang is ready at ``now``.
    """
    turn = decide_in_turn(
        gangs, queue, snapshot, now, config, reserved=reserved, leaving=leaving, spent=spent
    )
    return next(turn, None)


def decide_in_turn(
    gangs: Sequence[Gang],
    queue: GangQueue,
    snapshot: Snapshot,
    now: float,
    config: Config,
    *,
    reserved: Mapping[GangKey, Sequence[tuple[NodeName, Resources]]] | None = None,
    leaving: Mapping[GangKey, int] | None = None,
    spent: Collection[PodKey] | None = None,
) -> Generator[Decision]:
    """``run_cycle`` for every ready gang in turn, lazily: each decision is made on the snapshot
    with the bindings of the decisions before it, and recorded in ``queue`` before it is
    yielded. The caller takes as many as it likes (one cycle's worth) and must stop after a
    decision with victims: the room it holds changes what the next gangs may use.

    Ordering and gang building are paid once for the lot, not once per decision.
    """
    reserved = reserved or {}
    leaving = leaving or {}
    spent = spent or ()
    if config.risk is not None:
        config.risk.observe(snapshot.nodes, now)
    if config.shapes is not None:
        config.shapes.arrived(gangs, now)
    working = [g for g in gangs if has_work(g)]
    decided: set[GangKey] = set()
    for gang in _in_turn(queue.ready(working, now)):
        held = [r for key, room in reserved.items() if key != gang.key for r in room]
        view = snapshot.with_reserved(held)
        try:
            decision = decide(gang, working, view, config, decided)
            if decision.unschedulable is not None and min_waiting(gang):
                known = _Leaving(leaving.get(gang.key, 0), spent, held)
                decision = _reclaim(decision, gangs, view, config, known, now=now)
        except Exception as exc:  # one gang's fault must not stop the others
            decision = _faulted(gang, len(snapshot.nodes), exc)
        if decision.unschedulable is None and decision.progressed:
            queue.succeeded(gang.key)
        else:
            queue.failed(gang.key, now)
        decided.add(gang.key)
        if decision.bindings:
            snapshot = snapshot.with_assignments(decision.bindings)
        yield decision
