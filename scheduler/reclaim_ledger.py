"""Reclaim bookkeeping: who was asked to leave for whom, when they go, what room is held. Pure.

:mod:`scheduler.reclaim` decides whom to ask to leave; this ledger remembers it between cycles,
for the live loop (:mod:`scheduler.runner`) and the simulator (:mod:`scheduler.simulate`) alike.
Every method takes ``now``; nothing here reads a clock, writes to the API or knows a thread.

Per victim (a bound pod asked to leave so that a gang's minimum fits)::

    chosen(gang, now) or adopted(annotations) --> asked(gang, evict_at)
    chosen(gang, now, wait) --> waiting(gang, until, mark)     (no leave-by written yet)
    waiting --(its checkpoint mark changed, it reports none, or now >= until: proceed())-->
             asked(gang, now + grace)
    waiting --(its node's warning withdrawn: cancel_waits(); for a reclaim, its gang gone or
             placed)--> forgotten
    asked --(now >= evict_at, pod bound and not deleting: due())--> evicting
    evicting --(eviction_failed(now))--> asked(gang, now + retry)
    evicting --(evicted())--> evicted                       (waits to go; not evicted again)
    any --(pod gone, unbound or finished)--> forgotten

A *waiting* victim was chosen with patience (the gang it leaves for allows its reclaim to wait
for the victim's next checkpoint, :mod:`scheduler.loss`) or because its node is expected to go
(an early warning, :mod:`scheduler.early_warning`): it is spent and leaving like an asked one,
but has no leave-by until :meth:`ReclaimLedger.proceed` asks it. A scheduler that restarts
forgets waiting victims (nothing is written for them): the next plan chooses again.

A gang whose maximum was lowered below its bound members asks its youngest surplus members to
leave for itself, the same way (``ask(..., hold=False)``: no room is held for it).

A victim asked to leave is *spent* until it is forgotten: chosen again (for its own gang or
another one) it is not asked again, and its gang and ``evict_at`` stay as they are, so its
leave-by never moves later once set (two gangs that chose the same victim once asked it in
turn, each for itself, pushing its leave-by on every cycle). Victims count as *leaving* for
their gang until they are forgotten; the cycle chooses no new victims for a gang with some still
leaving, and counts the room that every spent victim will free (less the room held for its
gang) when it plans for another gang (:meth:`ReclaimLedger.spent`).

Per gang that reclaimed, the room its minimum was nominated on is *held* (charged to every
other gang) from ``chosen`` until the first of: the gang's decision places members
(``placed``), the gang is gone, it has met its minimum, or ``now`` reaches ``evict_at +
hold_extra``.

Victims a previous scheduler instance chose carry ``shoal.dev/reclaimed-for`` (the gang) and
``shoal.dev/leave-by`` (the eviction time, RFC 3339); a leave-by that cannot be read as a time
with a zone means "now", never an error.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from contracts import names
from contracts.times import format_time, parse_time_or
from scheduler.loss import checkpoint_mark, progress_of
from scheduler.model import Gang, GangKey, NodeName, PodKey, PodRequest, Resources

#: Room held for one gang: (node, what one member asks) per nominated member.
Room = tuple[tuple[NodeName, Resources], ...]


@dataclass(frozen=True, slots=True)
class Wait:
    """A victim chosen but not asked yet: asked at its next checkpoint, at ``until`` at the
    latest."""

    until: float
    #: Its last complete checkpoint when chosen (:func:`scheduler.loss.checkpoint_mark`).
    mark: tuple[int, float]
    #: Why it was chosen (its Event says it when it is asked).
    why: str
    #: The node whose early warning moves it (``None``: a reclaim for another gang).
    node: NodeName | None = None


@dataclass(frozen=True, slots=True)
class Victim:
    #: The gang the victim leaves for.
    gang: GangKey
    #: When it is evicted if it has not left by then.
    evict_at: float
    #: Its eviction was accepted: it is terminating and only waits to go.
    evicted: bool = False
    #: Not asked yet: it waits for its next checkpoint.
    wait: Wait | None = None


@dataclass(frozen=True, slots=True)
class Proceed:
    """A waiting victim asked now: ``key`` leaves for ``gang`` by ``leave_by``, ``why``."""

    key: PodKey
    gang: GangKey
    leave_by: float
    why: str


@dataclass(frozen=True, slots=True)
class Hold:
    room: Room
    until: float


@dataclass(frozen=True, slots=True)
class ReclaimUpdate:
    #: Per gang, how many of the victims asked to leave for it are still there.
    leaving: Mapping[GangKey, int]
    #: Gangs whose held room was given up on this update.
    expired: tuple[GangKey, ...] = ()


def parse_leave_by(text: str | None, default: float) -> float:
    """The time in a ``shoal.dev/leave-by`` annotation, or ``default`` when there is none or it
    is not an RFC 3339 time with a zone (total: it never raises)."""
    return parse_time_or(text, default)


def _gone(pod: PodRequest | None) -> bool:
    return pod is None or pod.node is None or pod.finished


@dataclass(slots=True)
class ReclaimLedger:
    """Victims, evictions in flight and held room (see the module's state machines)."""

    #: Seconds between asking a victim to leave and evicting it.
    grace: float
    #: Seconds a gang's room stays held beyond its victims' grace.
    hold_extra: float
    #: Seconds before a failed eviction is tried again (a PodDisruptionBudget, a conflict).
    retry: float = 5.0
    _victims: dict[PodKey, Victim] = field(default_factory=dict)
    _evicting: set[PodKey] = field(default_factory=set)
    _held: dict[GangKey, Hold] = field(default_factory=dict)

    # -- decisions ---------------------------------------------------------------------------------
    def chosen(
        self,
        gang: GangKey,
        victims: Iterable[PodKey],
        room: Iterable[tuple[NodeName, Resources]],
        now: float,
    ) -> float:
        """``gang``'s minimum fits on ``room`` once ``victims`` leave: hold the room, ask them
        to leave; returns the time they are evicted (their leave-by).

        Victims already spent (asked before, for any gang, and still there) are left as they
        are: they are not asked again and keep their gang and leave-by. :meth:`ask` says which
        victims were asked now."""
        return self.ask(gang, victims, room, now)[1]

    def ask(
        self,
        gang: GangKey,
        victims: Iterable[PodKey],
        room: Iterable[tuple[NodeName, Resources]],
        now: float,
        *,
        hold: bool = True,
        wait: Mapping[PodKey, Wait] | None = None,
    ) -> tuple[tuple[PodKey, ...], float]:
        """:meth:`chosen`, also returning the victims asked to leave now (those not already
        spent): only they get a leave-by (the time returned) and a word from the caller.
        ``hold=False`` holds no room (a gang's own members leaving it, above its maximum).
        Victims in ``wait`` are not asked yet: they wait (:meth:`proceed`), and the room stays
        held until the last of them could be evicted."""
        wait = wait or {}
        leave_by = now + self.grace
        latest = max((w.until + self.grace for w in wait.values()), default=leave_by)
        if hold:
            self._held[gang] = Hold(tuple(room), max(leave_by, latest) + self.hold_extra)
        asked: list[PodKey] = []
        for key in victims:
            if key in self._victims:
                continue
            waits = wait.get(key)
            if waits is not None:
                self._victims[key] = Victim(gang, waits.until + self.grace, wait=waits)
                continue
            self._victims[key] = Victim(gang, leave_by)
            asked.append(key)
        return tuple(asked), leave_by

    def proceed(self, pods: Mapping[PodKey, PodRequest], now: float) -> tuple[Proceed, ...]:
        """Waiting victims to ask now: their checkpoint changed (or they report none any
        more), or their wait is over; each leaves by ``now + grace``."""
        asked: list[Proceed] = []
        for key, victim in list(self._victims.items()):
            pod = pods.get(key)
            if victim.wait is None or pod is None:
                continue
            reason = _ready(victim.wait, pod, now)
            if reason is not None:
                leave_by = now + self.grace
                self._victims[key] = Victim(victim.gang, leave_by)
                asked.append(Proceed(key, victim.gang, leave_by, f"{victim.wait.why}; {reason}"))
        return tuple(asked)

    def cancel_waits(self, warned: Collection[NodeName]) -> None:
        """Forget victims waiting because of an early warning on a node no longer in
        ``warned`` (the warning was withdrawn): nothing was written for them."""
        for key, victim in list(self._victims.items()):
            node = victim.wait.node if victim.wait is not None else None
            if node is not None and node not in warned:
                del self._victims[key]

    def placed(self, gang: GangKey) -> None:
        """``gang``'s decision placed members: the room held for it is theirs now."""
        self._held.pop(gang, None)

    # -- each cycle --------------------------------------------------------------------------------
    def update(
        self, gangs: Iterable[Gang], pods: Mapping[PodKey, PodRequest], now: float
    ) -> ReclaimUpdate:
        """Pick up victims a previous scheduler chose, forget victims that left, give up holds
        that ended; ``gangs`` are every gang there is, ``pods`` every pod."""
        alive = {gang.key: gang for gang in gangs}
        for gang in alive.values():
            self._adopt(gang, now)
        for left in [k for k, v in self._victims.items() if _forgotten(v, pods.get(k), alive)]:
            del self._victims[left]
        expired = tuple(k for k, hold in self._held.items() if _ended(hold, alive.get(k), now))
        for ended in expired:
            del self._held[ended]
        return ReclaimUpdate(self.leaving(), expired)

    def _adopt(self, gang: Gang, now: float) -> None:
        for member in gang.bound:
            target = member.annotations.get(names.RECLAIMED_FOR_ANNOTATION)
            if target and member.key not in self._victims:
                notice = member.annotations.get(names.LEAVE_BY_ANNOTATION)
                self._victims[member.key] = Victim(GangKey(target), parse_leave_by(notice, now))

    def due(self, pods: Mapping[PodKey, PodRequest], now: float) -> tuple[PodKey, ...]:
        """Victims to evict now (their time has come, they are still bound and not being
        deleted); they are in flight until :meth:`evicted` or :meth:`eviction_failed`."""
        due: list[PodKey] = []
        for key, victim in list(self._victims.items()):
            pod = pods.get(key)
            if pod is None or pod.node is None or pod.finished:
                del self._victims[key]
                continue
            if victim.evicted or victim.wait or victim.evict_at > now or pod.deleting:
                continue
            if self.start_eviction(key):
                due.append(key)
        return tuple(due)

    # -- evictions ---------------------------------------------------------------------------------
    def start_eviction(self, key: PodKey) -> bool:
        """Mark ``key`` in flight; ``False`` when it already is (evictions for other reasons,
        a torn gang's release, go through here too so that no pod is evicted twice at once)."""
        if key in self._evicting:
            return False
        self._evicting.add(key)
        return True

    def evicted(self, key: PodKey) -> None:
        """The eviction of ``key`` was accepted: a victim only waits to go now."""
        self._evicting.discard(key)
        victim = self._victims.get(key)
        if victim is not None:
            self._victims[key] = Victim(victim.gang, victim.evict_at, evicted=True)

    def eviction_failed(self, key: PodKey, now: float) -> None:
        """The eviction of ``key`` failed: a victim is tried again ``retry`` seconds later."""
        self._evicting.discard(key)
        victim = self._victims.get(key)
        if victim is not None:
            self._victims[key] = Victim(victim.gang, now + self.retry)

    # -- what the cycle and the clock need ---------------------------------------------------------
    def leaving(self) -> dict[GangKey, int]:
        """Per gang, how many victims asked to leave for it are still recorded."""
        counts: dict[GangKey, int] = {}
        for victim in self._victims.values():
            counts[victim.gang] = counts.get(victim.gang, 0) + 1
        return counts

    def waits_for(self, gang: GangKey) -> tuple[int, float] | None:
        """How many victims chosen for ``gang`` wait for their next checkpoint, and the latest
        time one is asked; ``None`` when none waits."""
        untils = [
            v.wait.until for v in self._victims.values() if v.gang == gang and v.wait is not None
        ]
        return (len(untils), max(untils)) if untils else None

    def spent(self) -> dict[PodKey, GangKey]:
        """Victims asked to leave and still recorded, with the gang each leaves for: no gang
        asks them again, and every gang's reclaim plan counts the room they will free."""
        return {key: victim.gang for key, victim in self._victims.items()}

    def reserved(self) -> dict[GangKey, Room]:
        """The room held per gang (the cycle charges it to every other gang)."""
        return {key: hold.room for key, hold in self._held.items()}

    def next_due(self) -> float | None:
        """The earliest time an eviction falls due or a hold ends (evictions in flight or done
        are not due: their outcome wakes the loop)."""
        times = [
            v.wait.until if v.wait is not None else v.evict_at
            for key, v in self._victims.items()
            if not v.evicted and key not in self._evicting
        ]
        times.extend(hold.until for hold in self._held.values())
        return min(times, default=None)


def _forgotten(victim: Victim, pod: PodRequest | None, alive: Mapping[GangKey, Gang]) -> bool:
    """A victim left; or it waits, unasked, for a gang that is gone or needs it no more."""
    if _gone(pod):
        return True
    wait = victim.wait
    if wait is None or wait.node is not None:
        return False
    gang = alive.get(victim.gang)
    return gang is None or gang.min_missing == 0


def _ready(wait: Wait, pod: PodRequest, now: float) -> str | None:
    """Why a waiting victim is asked now, or ``None`` while it still waits."""
    progress = progress_of(pod)
    mark = checkpoint_mark(progress)
    if progress is None or mark is None:
        return "asked at once: it reports no valid progress any more"
    if mark != wait.mark:
        return f"asked at its new checkpoint (step {progress.checkpoint_step})"
    if now >= wait.until:
        return f"no new checkpoint by {format_time(wait.until)}, the most it may wait: asked now"
    return None


def _ended(hold: Hold, gang: Gang | None, now: float) -> bool:
    """The one rule for a hold: its gang is gone, has met its minimum, or the time is up."""
    return gang is None or gang.min_missing == 0 or hold.until <= now
