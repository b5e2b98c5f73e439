"""Torn gangs: some members bound, fewer than the minimum, and how long that may last. Pure.

A gang is *torn* when it has bound members but fewer than its minimum: members were deleted
between the decision and their binding, a node went away under a member, or the scheduler died
between two binds. The bound members hold GPUs that train nothing until the rest join them.

The state machine, per gang, driven by :meth:`TornLedger.update` with the cycle's gangs and
``now``::

    whole --(bound < minimum)--> torn(since) --(members arrive and bind)--> whole
                                     |
                                     +--(grace passes)--> due: release the bound members
                                                          (again every ``retry`` seconds while
                                                          it stays torn; an eviction can fail)

A torn gang is completed first when replacements arrive within the grace (the cycle puts torn
gangs before every other); after the grace its bound members are released (evicted, with an
Event saying why) so that a controller that recreates them (a Job, a PyTorchJob) brings the
gang back whole, and their GPUs serve others meanwhile. A gang with a member that succeeded is
finishing, not torn, and is left alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from scheduler.model import Gang, GangKey


def is_torn(gang: Gang) -> bool:
    """Bound members, but fewer than the minimum, and none finished with success."""
    return bool(gang.bound) and gang.min_missing > 0 and gang.succeeded == 0


@dataclass(frozen=True, slots=True)
class TornUpdate:
    #: Gangs that became torn on this update, with the time their members will be released.
    started: tuple[tuple[Gang, float], ...] = ()
    #: Gangs torn for longer than the grace: release their bound members now.
    due: tuple[Gang, ...] = ()


@dataclass(slots=True)
class TornLedger:
    """Since when each gang is torn, and when its release is (next) due."""

    grace: float
    retry: float = 5.0
    _since: dict[GangKey, float] = field(default_factory=dict)
    _next_release: dict[GangKey, float] = field(default_factory=dict)

    def update(self, gangs: Iterable[Gang], now: float) -> TornUpdate:
        started: list[tuple[Gang, float]] = []
        due: list[Gang] = []
        torn_now: set[GangKey] = set()
        for gang in gangs:
            if not is_torn(gang):
                continue
            torn_now.add(gang.key)
            since = self._since.get(gang.key)
            if since is None:
                self._since[gang.key] = now
                self._next_release[gang.key] = now + self.grace
                started.append((gang, now + self.grace))
                continue
            if now >= self._next_release[gang.key]:
                self._next_release[gang.key] = now + self.retry
                due.append(gang)
        for key in list(self._since):
            if key not in torn_now:
                del self._since[key]
                del self._next_release[key]
        return TornUpdate(tuple(started), tuple(due))

    def since(self, key: GangKey) -> float | None:
        return self._since.get(key)

    def next_due(self) -> float | None:
        """The earliest time a release falls due (the loop wakes then)."""
        return min(self._next_release.values(), default=None)
