"""One step of the scheduling loop, the same for the live loop and the simulator. Pure.

The live loop (:mod:`scheduler.runner`, on the API server's clock) and the simulator
(:mod:`scheduler.simulate.engine`, on a virtual one) each take a snapshot, build the gangs, and
run :func:`step`; they differ only in how they carry out its effects (API writes on a worker
pool, or changes to a simulated cluster) and in how they learn what happened since (informers,
or the simulator's own events). Every piece of time-dependent state the step reads and writes
lives in :class:`Ledgers`: the queue's backoffs (:mod:`scheduler.queue`), victims and held room
(:mod:`scheduler.reclaim_ledger`), torn gangs (:mod:`scheduler.torn`).

The story of a step at ``now``, on a snapshot and every gang built from it::

    ledgers  queue forgets gangs gone; the reclaim ledger adopts victims a previous instance
             chose, forgets those that left, gives up holds that ended
    due      victims whose leave-by passed are handed out for eviction (Opening.evict);
             gangs bound above a lowered maximum ask their youngest surplus members to leave
             through the reclaim ledger (Opening.shrunk), never below the maximum;
             stuck torn gangs are told (Opening.told), those past their grace released: their
             survivors are asked to leave through the reclaim ledger (Opening.released);
             victims waiting for their next checkpoint that reached it (or their wait's end)
             are asked now, and the surplus members of nodes with an early warning are asked
             to leave for their own gang, at their next checkpoint (scheduler.early_warning)
             (Opening.asks);
             a gang whose raised minimum is above its bound members, while they still meet
             the minimum it ran with and the rest could fit beside them, is patient: it
             keeps running, is neither warned nor released, and waits for room
    decide   gangs in turn on the snapshot (scheduler.cycle.decide_in_turn), lazily, one
             Outcome each, each decision on the room the ones before it left
    apply    each decision's ledger side before it is handed out: victims asked (never one
             already asked; those of a gang with patience that report progress wait for their
             next checkpoint instead, scheduler.loss), room held or given to the members
             placed, a torn gang with no room and none on its way is stuck; what its pods are
             told (Outcome.unplaced)

A step decides for at most ``batch_decisions`` gangs and ends after a decision with victims (the
room it holds changes what the next gangs may use). The caller may stop taking outcomes sooner
(the live loop has a time budget): each outcome's ledger side is applied before it is handed
out, so an outcome not taken was never decided. News from outside comes back through
:meth:`Ledgers.freed`, :meth:`Ledgers.bind_failed`, :meth:`Ledgers.evicted` and
:meth:`Ledgers.eviction_failed`, between steps.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from contracts.times import format_time
from scheduler import early_warning
from scheduler.cache import Snapshot, node_state
from scheduler.cycle import Config, Decision, decide_in_turn, replacements_fit
from scheduler.loss import checkpoint_mark, patience, progress_of
from scheduler.model import (
    Gang,
    GangKey,
    NodeName,
    NodeState,
    PodKey,
    PodRequest,
    Unschedulable,
)
from scheduler.placement import Request, place
from scheduler.queue import GangQueue
from scheduler.reclaim_ledger import Proceed, ReclaimLedger, Room, Wait
from scheduler.torn import Torn, TornLedger, survivors


@dataclass(frozen=True, slots=True)
class StepSettings:
    """What a step decides with; the live loop's defaults (``scheduler.runner.Settings``)."""

    config: Config = field(default_factory=Config)
    initial_backoff: float = 1.0
    max_backoff: float = 10.0
    #: A step decides for up to this many gangs in turn on its snapshot.
    batch_decisions: int = 64
    #: Seconds between asking a reclaimed pod to leave and evicting it.
    reclaim_grace: float = 30.0
    #: Room held for a gang after its victims were chosen, beyond the grace.
    hold_extra: float = 120.0
    #: How long a gang may stay torn and stuck before its survivors are released.
    torn_grace: float = 60.0
    #: Patience per PriorityClass name (scheduler.loss.patience), when a gang says none.
    class_patience: Mapping[str, float] = field(default_factory=dict)
    #: Move surplus members off nodes with an early warning (scheduler.early_warning).
    early_warnings: bool = True
    #: The longest a surplus member of a warned node waits for its next checkpoint.
    early_warning_wait: float = 600.0


@dataclass(frozen=True, slots=True)
class Release:
    """A torn gang past its grace: ``asked`` (its survivors not asked before) leave by
    ``leave_by``."""

    torn: Torn
    asked: tuple[PodRequest, ...]
    leave_by: float


@dataclass(frozen=True, slots=True)
class Shrink:
    """``gang`` is bound above its maximum: ``asked`` (its youngest surplus members, none asked
    before) leave by ``leave_by``."""

    gang: Gang
    asked: tuple[PodRequest, ...]
    leave_by: float


@dataclass(frozen=True, slots=True)
class Ask:
    """``asked`` leave for ``gang`` by ``leave_by``, each for the reason in ``why``: victims
    that waited for their checkpoint, or surplus members of a node with an early warning
    (``gang`` is then their own)."""

    gang: Gang
    asked: tuple[PodRequest, ...]
    leave_by: float
    why: Mapping[PodKey, str] = field(default_factory=dict)
    #: Chosen now too, but waiting for their next checkpoint (asked in a later step).
    waiting: tuple[PodRequest, ...] = ()


@dataclass(frozen=True, slots=True)
class Unplaced:
    """``pods`` of ``gang`` wait, for the reason ``message``; ``waiting``: only for members."""

    gang: Gang
    pods: tuple[PodRequest, ...]
    message: str
    waiting: bool = False


@dataclass(frozen=True, slots=True)
class Opening:
    """What a step does before its decisions."""

    #: Victims to evict now (in flight until :meth:`Ledgers.evicted` or ``eviction_failed``).
    evict: tuple[PodRequest, ...] = ()
    #: Stuck torn gangs to tell (again when what they are told changes).
    told: tuple[Torn, ...] = ()
    #: Torn gangs released now.
    released: tuple[Release, ...] = ()
    #: Gangs whose held room was given back (room freed for the others).
    expired: tuple[GangKey, ...] = ()
    #: Gangs above a lowered maximum: their surplus members asked to leave now.
    shrunk: tuple[Shrink, ...] = ()
    #: Waiting victims asked now, and members moved off nodes with an early warning.
    asks: tuple[Ask, ...] = ()


@dataclass(frozen=True, slots=True)
class Outcome:
    """One decision and what carrying it out means."""

    decision: Decision
    #: Victims asked to leave now for the gang, by ``leave_by`` (none already asked before).
    asked: tuple[PodRequest, ...] = ()
    leave_by: float | None = None
    #: Why each victim was chosen (its expected loss and rank).
    why: Mapping[PodKey, str] = field(default_factory=dict)
    #: Victims chosen that wait for their next checkpoint before they are asked.
    waiting: tuple[PodRequest, ...] = ()
    #: Room held for these members of the gang meanwhile (``status.nominatedNodeName``).
    nominated: tuple[tuple[PodRequest, NodeName], ...] = ()
    #: The gang is torn and stuck: tell its users (new, or what it says changed).
    told: Torn | None = None
    #: What the gang's waiting pods are told.
    unplaced: Unplaced | None = None
    #: The pods placed, with their nodes (minimum quorum first).
    binds: tuple[tuple[PodRequest, NodeName], ...] = ()


@dataclass(frozen=True, slots=True)
class Step:
    opening: Opening
    #: Room held per gang when the decisions began (charged to every other gang).
    reserved: Mapping[GangKey, Room]
    #: The decisions, lazily; close it to stop early.
    outcomes: Generator[Outcome]


class Ledgers:
    """The step's state between steps: backoffs, victims and held room, torn gangs."""

    def __init__(self, settings: StepSettings) -> None:
        self.settings = settings
        self.queue = GangQueue(
            initial_backoff=settings.initial_backoff, max_backoff=settings.max_backoff
        )
        self.reclaims = ReclaimLedger(settings.reclaim_grace, settings.hold_extra)
        self.torn = TornLedger(settings.torn_grace)

    # -- news from outside, between steps ---------------------------------------------------------
    def freed(self) -> None:
        """Room may have appeared: every backoff ends."""
        self.queue.wake()

    def bind_failed(self, gang: GangKey, when: float) -> None:
        """A binding of ``gang`` failed at ``when``: it backs off like a gang that did not fit."""
        self.queue.failed(gang, when)

    def evicted(self, key: PodKey) -> None:
        self.reclaims.evicted(key)

    def eviction_failed(self, key: PodKey, now: float) -> None:
        self.reclaims.eviction_failed(key, now)

    def next_due(self, working: Iterable[GangKey] = ()) -> float | None:
        """When a step has something to do without news: an eviction or hold falling due, a
        torn gang's release, or the end of the backoff of one of ``working``."""
        times = [
            self.queue.next_ready(working),
            self.reclaims.next_due(),
            self.torn.next_due(),
        ]
        return min((t for t in times if t is not None), default=None)


def step(ledgers: Ledgers, gangs: Sequence[Gang], snapshot: Snapshot, now: float) -> Step:
    """One step at ``now`` on ``snapshot`` and ``gangs`` (every gang built from it)."""
    ledgers.queue.prune(g.key for g in gangs)
    reclaims = ledgers.reclaims
    update = reclaims.update(gangs, snapshot.pods, now)
    evict = tuple(snapshot.pods[key] for key in reclaims.due(snapshot.pods, now))
    shrunk = tuple(_shrink(reclaims, gangs, now))
    asks = _proceed(reclaims, gangs, snapshot.pods, now)
    if ledgers.settings.early_warnings:
        asks += tuple(_warned(reclaims, gangs, snapshot, now, ledgers.settings))
    reserved = reclaims.reserved()
    patient = frozenset(
        g.key
        for g in gangs
        if ledgers.torn.raised(g) and _fits_beside_itself(g, snapshot, ledgers.settings.config)
    )
    torn = ledgers.torn.update(gangs, now, patient=patient)
    released = tuple(_release(reclaims, due, now) for due in torn.due)
    opening = Opening(evict, torn.told, released, update.expired, shrunk, asks)
    outcomes = _decide(
        ledgers, gangs, snapshot, now, reserved=reserved, leaving=update.leaving, patient=patient
    )
    return Step(opening, reserved, outcomes)


def _shrink(reclaims: ReclaimLedger, gangs: Sequence[Gang], now: float) -> Iterator[Shrink]:
    """Gangs bound above their maximum (it was lowered: a stage change) ask their youngest
    surplus members to leave, as a reclaim does; members already asked to leave (for any
    gang) count as gone and are not asked again, so the gang never goes below its maximum,
    which is never below its minimum."""
    spent = reclaims.spent()
    for gang in gangs:
        if len(gang.bound) <= gang.max_member or gang.succeeded:
            continue
        staying = [p for p in survivors(gang) if p.key not in spent]
        extra = len(staying) - gang.max_member
        if extra <= 0:
            continue
        # Youngest first; among pods created in the same second, the later name.
        youngest = sorted(staying, key=lambda p: (p.created, p.name), reverse=True)[:extra]
        keys, leave_by = reclaims.ask(gang.key, (p.key for p in youngest), (), now, hold=False)
        fresh = set(keys)
        yield Shrink(gang, tuple(p for p in youngest if p.key in fresh), leave_by)


def _fits_beside_itself(gang: Gang, snapshot: Snapshot, config: Config) -> bool:
    """Whether the members ``gang`` lacks for its minimum would fit if its own bound members
    were the only pods on the cluster: then room can appear or be reclaimed for them, and the
    gang waits for it. When not, its bounds cannot be met on this cluster at all."""
    needed = list(gang.pending)[: gang.min_missing]
    if len(needed) < gang.min_missing:
        needed.extend(gang.bound[: gang.min_missing - len(needed)])  # same shape, to be created
    if not needed:
        return False
    own: dict[NodeName, list[PodRequest]] = {}
    for pod in survivors(gang):
        if pod.node is not None:
            own.setdefault(pod.node, []).append(pod)
    nodes: dict[NodeName, NodeState] = {
        name: node_state(state.node, own.get(name, ())) for name, state in snapshot.nodes.items()
    }
    request = Request(
        gang=gang.key,
        pods=needed,
        topology_keys=config.topology_keys,
        required=gang.topology_required,
        preferred=gang.topology_preferred,
        bound_nodes=tuple(own),
        weights=config.weights,
    )
    return not isinstance(place(request, nodes), Unschedulable)


def _release(reclaims: ReclaimLedger, torn: Torn, now: float) -> Release:
    """Ask a torn gang's survivors to leave as a reclaim does; members already asked to leave
    (for any gang) keep the leave-by they have."""
    alive = torn.survivors
    keys, leave_by = reclaims.ask(torn.gang.key, (p.key for p in alive), (), now)
    fresh = set(keys)
    return Release(torn, tuple(p for p in alive if p.key in fresh), leave_by)


def _decide(
    ledgers: Ledgers,
    gangs: Sequence[Gang],
    snapshot: Snapshot,
    now: float,
    *,
    reserved: Mapping[GangKey, Room],
    leaving: Mapping[GangKey, int],
    patient: frozenset[GangKey] = frozenset(),
) -> Generator[Outcome]:
    settings = ledgers.settings
    turn = decide_in_turn(
        gangs,
        ledgers.queue,
        snapshot,
        now,
        settings.config,
        reserved=reserved,
        leaving=leaving,
        spent=ledgers.reclaims.spent(),
    )
    try:
        for count, decision in enumerate(turn, start=1):
            yield _apply(ledgers, decision, snapshot, now, patient=decision.gang.key in patient)
            if decision.victims or count >= settings.batch_decisions:
                return
    finally:
        turn.close()


def _apply(
    ledgers: Ledgers,
    decision: Decision,
    snapshot: Snapshot,
    now: float,
    *,
    patient: bool = False,
) -> Outcome:
    """The ledger side of ``decision``, and what carrying it out means."""
    gang = decision.gang
    members = {p.key: p for p in gang.members}
    asked: tuple[PodRequest, ...] = ()
    waiting: tuple[PodRequest, ...] = ()
    leave_by: float | None = None
    if decision.victims:
        pods = snapshot.pods
        victims = [pods[key] for key in decision.victims if key in pods]
        room = ((a.node, members[a.pod].requests) for a in decision.nominated)
        seconds = patience(gang, snapshot.pod_groups, ledgers.settings.class_patience)
        wait = _checkpoint_waits(victims, _waited(gang, victims, decision.why), now + seconds)
        wait = wait if seconds > 0 else {}
        keys, leave_by = ledgers.reclaims.ask(
            gang.key, (p.key for p in victims), room, now, wait=wait
        )
        fresh = set(keys)
        asked = tuple(p for p in victims if p.key in fresh)
        waiting = tuple(p for p in victims if p.key in wait)
    told = _stuck(ledgers, decision, now)
    if decision.bindings:
        ledgers.reclaims.placed(gang.key)
    return Outcome(
        decision,
        asked=asked,
        leave_by=leave_by,
        why=decision.why,
        waiting=waiting,
        nominated=tuple((members[a.pod], a.node) for a in decision.nominated),
        told=told,
        unplaced=_unplaced(decision, patient, ledgers.reclaims.waits_for(gang.key)),
        binds=tuple((members[a.pod], a.node) for a in decision.bindings),
    )


def _waited(
    gang: Gang, victims: Sequence[PodRequest], why: Mapping[PodKey, str]
) -> dict[PodKey, str]:
    """What a victim that waits for its checkpoint is told once asked."""
    default = f"chosen to make room for gang {gang.name}"
    return {p.key: f"{why.get(p.key, default)}; waited for its next checkpoint" for p in victims}


def _proceed(
    reclaims: ReclaimLedger, gangs: Sequence[Gang], pods: Mapping[PodKey, PodRequest], now: float
) -> tuple[Ask, ...]:
    """Waiting victims asked now, grouped by the gang they leave for and their leave-by."""
    by_key = {g.key: g for g in gangs}
    groups: dict[tuple[GangKey, float], list[Proceed]] = {}
    for ready in reclaims.proceed(pods, now):
        groups.setdefault((ready.gang, ready.leave_by), []).append(ready)
    asks: list[Ask] = []
    for (key, leave_by), ready_ones in groups.items():
        gang = by_key.get(key)
        if gang is not None:
            asked = tuple(pods[r.key] for r in ready_ones)
            asks.append(Ask(gang, asked, leave_by, {r.key: r.why for r in ready_ones}))
    return tuple(asks)


def _warned(
    reclaims: ReclaimLedger,
    gangs: Sequence[Gang],
    snapshot: Snapshot,
    now: float,
    settings: StepSettings,
) -> Iterator[Ask]:
    """Surplus members on nodes with an early warning leave for their own gang: at their next
    checkpoint (at most ``early_warning_wait`` later), at once when they report no progress;
    least expected loss first, never taking the gang below its minimum (members already
    leaving count as gone), and only as many as their replacements fit on the other nodes now
    (a member with nowhere to go stays until the node's own notice)."""
    warned = {n: w for n, s in snapshot.nodes.items() if (w := early_warning.warning(s.node))}
    reclaims.cancel_waits(warned)
    if not warned:
        return
    spent = reclaims.spent()
    cost, until = settings.config.victim_cost, now + settings.early_warning_wait
    for gang in gangs:
        staying = [p for p in survivors(gang) if p.key not in spent]
        movable = [p for p in staying if p.node in warned and not early_warning.told_by_agent(p)]
        extra = len(staying) - gang.min_member
        if not movable or extra <= 0:
            continue
        youngest = sorted(movable, key=lambda p: (p.created, p.name), reverse=True)
        cheapest = sorted(youngest, key=lambda p: cost(p, now).rank())[:extra]
        movers = _replaceable(gang, cheapest, snapshot, warned, settings.config)
        if not movers:
            continue
        why = {p.key: _warned_why(gang, p, warned) for p in movers}
        waits = _checkpoint_waits(movers, why, until, warned=True)
        keys, leave_by = reclaims.ask(gang.key, why, (), now, hold=False, wait=waits)
        asked = tuple(p for p in movers if p.key in set(keys))
        waiting = tuple(p for p in movers if p.key in waits)
        if asked or waiting:
            texts = {k: f"{why[k]}; asked at once" for k in keys}
            yield Ask(gang, asked, leave_by, texts, waiting)


def _replaceable(
    gang: Gang,
    movers: Sequence[PodRequest],
    snapshot: Snapshot,
    warned: Mapping[NodeName, str],
    config: Config,
) -> Sequence[PodRequest]:
    """The first of ``movers`` whose replacements (same shape) all fit, together, on the nodes
    without a warning as they are now, placed as the gang's surplus members are (its bound on
    each member's risk included: a member whose replacement could only go to capacity riskier
    than the bound allows stays where it is)."""
    elsewhere = Snapshot(
        {n: s for n, s in snapshot.nodes.items() if n not in warned},
        snapshot.pods,
        snapshot.pod_groups,
    )
    leaving = {p.key for p in movers}
    staying = tuple(p.node for p in survivors(gang) if p.node and p.key not in leaving)
    for count in range(len(movers), 0, -1):
        if replacements_fit(gang, movers[:count], elsewhere, config, staying):
            return movers[:count]
    return ()


def _warned_why(gang: Gang, pod: PodRequest, warned: Mapping[NodeName, str]) -> str:
    node = pod.node or NodeName("")
    return (
        f"node {node} is expected to go ({warned[node]}); gang {gang.name} keeps its minimum "
        f"{gang.min_member} without this surplus member, and its replacement is placed elsewhere"
    )


def _checkpoint_waits(
    pods: Sequence[PodRequest],
    why: Mapping[PodKey, str],
    until: float,
    *,
    warned: bool = False,
) -> dict[PodKey, Wait]:
    """A wait for the next checkpoint for each of ``pods`` that reports progress (those that
    report none are asked at once); ``warned``: because of their node's early warning."""
    waits: dict[PodKey, Wait] = {}
    for pod in pods:
        mark = checkpoint_mark(progress_of(pod))
        if mark is not None:
            node = pod.node if warned else None
            waits[pod.key] = Wait(until, mark, why[pod.key], node=node)
    return waits


def _stuck(ledgers: Ledgers, decision: Decision, now: float) -> Torn | None:
    """A torn gang whose members exist but found no room is stuck, unless room is on its way
    (victims chosen now, or asked to leave for it before)."""
    why = decision.unschedulable
    if why is None or why.waiting or decision.victims or decision.fault is not None:
        return None
    if ledgers.reclaims.leaving().get(decision.gang.key):
        return None
    return ledgers.torn.stuck(decision.gang, now)


def _unplaced(
    decision: Decision, patient: bool = False, checkpoints: tuple[int, float] | None = None
) -> Unplaced | None:
    """What the gang's waiting pods are told; ``checkpoints``: how many of the victims chosen
    for it wait for their next checkpoint, and until when at the latest."""
    gang = decision.gang
    why = decision.unschedulable
    if why is not None:
        message = why.message()
        if patient:
            message = f"{raised_minimum_text(gang)} {message}"
        if checkpoints is not None:
            count, until = checkpoints
            message = (
                f"Reclaim waits for the next checkpoint of {count} member(s) chosen to leave "
                f"for gang {gang.name}, until {format_time(until)} at the latest; {message}"
            )
        return Unplaced(gang, gang.pending, message, waiting=why.waiting)
    if decision.surplus_unschedulable is not None:
        placed = {a.pod for a in decision.bindings}
        waiting = tuple(p for p in gang.pending if p.key not in placed)
        message = (
            f"Surplus member of gang {gang.name} (minimum {gang.min_member} met): "
            f"{decision.surplus_unschedulable.message()}"
        )
        return Unplaced(gang, waiting, message)
    return None


def raised_minimum_text(gang: Gang) -> str:
    """What a patient gang (its minimum raised above its bound members) is told: it keeps
    running and what it waits for."""
    bound = len(survivors(gang))
    return (
        f"Gang {gang.name} runs with {bound} member(s) bound, below its raised minimum "
        f"{gang.min_member}; they keep running while it waits for room for "
        f"{gang.min_missing} more:"
    )
