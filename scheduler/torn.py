"""Torn gangs: some members bound, fewer than the minimum, what users are told and when the bound
members are released. Pure.

A gang is *torn* when it has *survivors* — bound members that are not being deleted — but fewer
than its minimum: members were deleted between the decision and their binding or after it, a
node went away under a member, the scheduler died between two binds, or a user raised the
minimum of a running gang. The survivors hold GPUs that train nothing until the rest join them.
A gang with a member that succeeded is finishing, not torn, and is left alone.

A torn gang is *stuck* when it cannot be completed now: fewer of its members exist than it lacks
(they must be created first), or they exist but a decision found no room for them. Only a stuck
gang is told (a ``GangBelowMinimum`` warning): a gang whose minimum was raised together with
members that the cycle places at once (a healthy scale-up) never hears of it.

The state machine, per gang, driven by :meth:`TornLedger.update` (every cycle, before the
decisions) and :meth:`TornLedger.stuck` (a decision that found no room)::

    whole --(survivors < minimum)--> torn(since)
    torn --(fewer members exist than it lacks: update)--------+
    torn --(they exist, no room: stuck)------------------------+--> told(release_at = now + grace)
    told --(what it says changes: survivors, counts)--> told again, on the survivors there are
    told --(now >= release_at: update)--> released: the survivors are asked to leave, once
    any --(whole again, finishing, gone, or no survivor)--> forgotten

A gang whose minimum was raised while it ran (a stage change) is torn too, but while its
survivors still meet the minimum it last ran with it is *raised*: if the members it lacks could
fit beside its own bound members on the cluster (the step checks), it is *patient* — it keeps
running, is neither told nor released, and waits for room (found, freed or reclaimed). Only a
raised minimum that cannot be met on the cluster at all, or survivors below the old minimum
too, take the path above: the user's bounds make the release unavoidable, and it comes after a
notice. The minimum each gang last met is kept for as long as the gang exists::

    whole(min m) --(minimum raised above the survivors, survivors >= m)--> raised
    raised, patient --(update(patient))--> not torn for the ledger (no entry, no release)

What a told gang says is written on its survivors (and its PodGroup): a member it was written on
that goes away changes the survivors, so it is written again on the ones that are left. A
released gang's survivors are asked to leave through the reclaim path (``shoal.dev/leave-by``,
the node agent tells their workers; see :mod:`scheduler.reclaim_ledger`): evicted once they
acknowledge, or at their leave-by; a controller that recreates them (a Job, a PyTorchJob) brings
the gang back whole, and their GPUs serve others meanwhile.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from contracts import names
from contracts.times import format_time
from scheduler.model import Gang, GangKey, PodKey, PodRequest


def survivors(gang: Gang) -> tuple[PodRequest, ...]:
    """The bound members that are not being deleted: where users look for the gang."""
    return tuple(p for p in gang.bound if not p.deleting)


def is_torn(gang: Gang) -> bool:
    """Survivors, but fewer than the minimum, and no member finished with success."""
    alive = len(survivors(gang))
    return alive > 0 and alive < gang.min_member and gang.succeeded == 0


@dataclass(frozen=True, slots=True)
class Shortfall:
    """What a torn gang lacks, counted from what is true."""

    bound: int
    minimum: int
    pending: int

    @classmethod
    def of(cls, gang: Gang) -> Shortfall:
        return cls(len(survivors(gang)), gang.min_member, len(gang.pending))

    @property
    def missing(self) -> int:
        """Members still to bind for the minimum."""
        return max(0, self.minimum - self.bound)

    @property
    def to_create(self) -> int:
        """Members that do not exist yet and are needed for the minimum."""
        return max(0, self.missing - self.pending)

    def text(self) -> str:
        """``2 of 3 bound; 2 members pending, no room for them`` or ``5 of 8 bound, 0 pending;
        waiting for 3 more member(s) to be created``."""
        head = f"{self.bound} of {self.minimum} bound"
        if self.to_create == 0:
            them = "it" if self.pending == 1 else "them"
            return f"{head}; {_members(self.pending)} pending, no room for {them}"
        waits = f"waiting for {self.to_create} more member(s) to be created"
        if self.pending:
            return f"{head}; {_members(self.pending)} pending, {waits}"
        return f"{head}, 0 pending; {waits}"

    def unless(self) -> str:
        """What would complete the gang."""
        if self.to_create == 0:
            return "room frees for its pending members"
        return "the missing members are created and bind"


def _members(count: int) -> str:
    return f"{count} member" if count == 1 else f"{count} members"


def below_minimum_message(name: str, shortfall: Shortfall, release_at: float) -> str:
    """The ``GangBelowMinimum`` warning of a stuck gang."""
    return (
        f"Gang {name} is below its minimum: {shortfall.text()}. Unless {shortfall.unless()}, "
        f"its bound members are asked to leave at {format_time(release_at)} (annotation "
        f"{names.LEAVE_BY_ANNOTATION}; the node agent tells their workers) and evicted once they "
        "acknowledge or their leave-by passes, so that their GPUs are not held by a gang that "
        "cannot run."
    )


def released_message(name: str, shortfall: Shortfall, since: float, leave_by: float) -> str:
    """The ``GangReleased`` warning: the survivors are asked to leave by ``leave_by``."""
    return (
        f"Gang {name} stayed below its minimum since {format_time(since)} "
        f"({shortfall.text()}): its bound members are asked to leave by {format_time(leave_by)} "
        f"(annotation {names.LEAVE_BY_ANNOTATION}; the node agent tells their workers, which may "
        "checkpoint and acknowledge) and evicted once they acknowledge, or then, so that the "
        "gang can be admitted whole again (a controller such as a Job recreates them)."
    )


@dataclass(frozen=True, slots=True)
class Torn:
    """A stuck gang as one update sees it."""

    gang: Gang
    #: Torn since.
    since: float
    #: When its survivors are asked to leave unless it is completed.
    release_at: float
    #: First time it is told (a log line says so).
    first: bool = False

    @property
    def survivors(self) -> tuple[PodRequest, ...]:
        return survivors(self.gang)

    @property
    def shortfall(self) -> Shortfall:
        return Shortfall.of(self.gang)


@dataclass(frozen=True, slots=True)
class TornUpdate:
    #: Stuck gangs to tell now: newly stuck, or what their explanation says changed.
    told: tuple[Torn, ...] = ()
    #: Stuck gangs past their grace: ask their survivors to leave now.
    due: tuple[Torn, ...] = ()


#: What a told explanation depends on: the survivors it is written on, pending, minimum.
_Said = tuple[tuple[PodKey, ...], int, int]


@dataclass(slots=True)
class _Entry:
    since: float
    release_at: float | None = None
    said: _Said | None = None
    released: bool = False


def _said(gang: Gang) -> _Said:
    return (tuple(p.key for p in survivors(gang)), len(gang.pending), gang.min_member)


@dataclass(slots=True)
class TornLedger:
    """Since when each gang is torn, whether it was told what, and when it is released."""

    grace: float
    _gangs: dict[GangKey, _Entry] = field(default_factory=dict)
    #: The minimum each gang with bound members last met.
    _met: dict[GangKey, int] = field(default_factory=dict)

    def raised(self, gang: Gang) -> bool:
        """``gang`` is torn only because its minimum was raised: its survivors still meet the
        minimum it last ran with."""
        met = self._met.get(gang.key)
        return met is not None and is_torn(gang) and met <= len(survivors(gang))

    def update(
        self, gangs: Iterable[Gang], now: float, *, patient: Collection[GangKey] = ()
    ) -> TornUpdate:
        """Bring every gang up to ``now``; ``gangs`` are every gang there is; ``patient`` are
        raised gangs that wait for room (never told nor released)."""
        told: list[Torn] = []
        due: list[Torn] = []
        torn_now: set[GangKey] = set()
        seen: set[GangKey] = set()
        for gang in gangs:
            seen.add(gang.key)
            if not is_torn(gang):
                self._note_met(gang)
                continue
            if gang.key in patient:
                continue
            torn_now.add(gang.key)
            entry = self._gangs.setdefault(gang.key, _Entry(since=now))
            if entry.release_at is None and Shortfall.of(gang).to_create > 0:
                entry.release_at = now + self.grace  # cannot be completed from what exists
            if entry.release_at is None or entry.released:
                continue
            if now >= entry.release_at:
                entry.released = True
                due.append(Torn(gang, entry.since, entry.release_at))
                continue
            said = _said(gang)
            if said != entry.said:
                told.append(Torn(gang, entry.since, entry.release_at, first=entry.said is None))
                entry.said = said
        for key in [k for k in self._gangs if k not in torn_now]:
            del self._gangs[key]
        for key in [k for k in self._met if k not in seen]:
            del self._met[key]
        return TornUpdate(tuple(told), tuple(due))

    def _note_met(self, gang: Gang) -> None:
        if gang.bound and len(survivors(gang)) >= gang.min_member:
            self._met[gang.key] = gang.min_member

    def stuck(self, gang: Gang, now: float) -> Torn | None:
        """A decision found no room for the members torn ``gang`` lacks, although they exist:
        it is stuck from ``now``. Returns what to tell (``None``: nothing new to say, or the
        gang was not torn at the last update, or is released already)."""
        entry = self._gangs.get(gang.key)
        if entry is None or entry.released:
            return None
        if entry.release_at is None:
            entry.release_at = now + self.grace
        said = _said(gang)
        if said == entry.said:
            return None
        first = entry.said is None
        entry.said = said
        return Torn(gang, entry.since, entry.release_at, first=first)

    def since(self, key: GangKey) -> float | None:
        entry = self._gangs.get(key)
        return None if entry is None else entry.since

    def next_due(self) -> float | None:
        """The earliest time a release falls due (the loop wakes then)."""
        return min(
            (
                e.release_at
                for e in self._gangs.values()
                if e.release_at is not None and not e.released
            ),
            default=None,
        )
