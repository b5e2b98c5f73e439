"""Pending gangs in order: priority (from the PriorityClass), then age, then name.

A gang that could not be placed backs off (exponentially, capped) and is skipped while it does,
so the gangs behind it — smaller ones included — get their cycles: a gang that can never fit does
not starve anyone. A cluster event that frees room (a pod finishing or leaving, a node added or
changed) ends every backoff at once, so waiting gangs are retried as soon as retrying can help.

Pure: ``now`` is always an argument.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from scheduler.model import Gang, GangKey


@dataclass(frozen=True, slots=True)
class Backoff:
    attempts: int
    until: float


def order_key(gang: Gang) -> tuple[int, float, str]:
    return (-gang.priority, gang.created, gang.key)


class GangQueue:
    def __init__(self, *, initial_backoff: float = 1.0, max_backoff: float = 30.0) -> None:
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self._backoff: dict[GangKey, Backoff] = {}

    def __len__(self) -> int:
        """How many gangs the queue remembers (bounded by the gangs alive at the last prune)."""
        return len(self._backoff)

    def ordered(self, gangs: Iterable[Gang], now: float) -> list[Gang]:
        """Gangs not backing off at ``now``, first to schedule first."""
        ready = self.ready(gangs, now)
        ready.sort(key=order_key)
        return ready

    def ready(self, gangs: Iterable[Gang], now: float) -> list[Gang]:
        """Gangs not backing off at ``now``, in the order given."""
        backoff = self._backoff
        return [g for g in gangs if (e := backoff.get(g.key)) is None or e.until <= now]

    def ready_at(self, key: GangKey) -> float:
        entry = self._backoff.get(key)
        return entry.until if entry is not None else 0.0

    def attempts(self, key: GangKey) -> int:
        entry = self._backoff.get(key)
        return entry.attempts if entry is not None else 0

    def failed(self, key: GangKey, now: float) -> float:
        """Record a failed attempt; returns when the gang will be tried again."""
        attempts = self.attempts(key) + 1
        delay = min(self.initial_backoff * 2.0 ** (attempts - 1), self.max_backoff)
        self._backoff[key] = Backoff(attempts, now + delay)
        return now + delay

    def succeeded(self, key: GangKey) -> None:
        self._backoff.pop(key, None)

    def wake(self) -> None:
        """Room may have been freed: every backing-off gang is ready now (attempts are kept)."""
        self._backoff = {k: Backoff(b.attempts, 0.0) for k, b in self._backoff.items()}

    def next_ready(self, keys: Iterable[GangKey]) -> float | None:
        """The earliest time any of ``keys`` stops backing off (``None`` if none is waiting)."""
        times = [self.ready_at(k) for k in keys]
        return min(times) if times else None

    def prune(self, alive: Iterable[GangKey]) -> None:
        keep = set(alive)
        self._backoff = {k: b for k, b in self._backoff.items() if k in keep}
