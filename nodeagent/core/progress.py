"""The workers' progress reports, paced to the API budget: pure, ``now`` passed in.

Each worker pod reports how far it is (the socket's ``Progress`` call); the agent writes the
newest report on the pod (``shoal.dev/progress``, :mod:`contracts.progress`) at most once per
pod per ``interval`` (:data:`contracts.progress.MIN_WRITE_INTERVAL_S`, one write per pod per
minute). The ledger decides what is due; the wiring (``nodeagent/wiring/progress.py``) writes
it. Per pod::

    unknown --report--> due (the first report of a pod is written at once)
    due --started--> writing --written--> quiet until the interval after the start
    quiet --report--> waiting (a later report replaces it: only the newest is written)
    waiting --interval passed--> due
    writing --failed--> waiting (the newest report, at the interval after the failed write:
                         an API server that fails is not sent more for it)
    any --forget (the pod left the node)--> unknown

A report that arrives while a write is under way waits for the interval after it. The ledger
holds at most one entry per pod it was told of, and forgets a pod that leaves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from contracts.progress import MIN_WRITE_INTERVAL_S, Progress
from nodeagent.core.events import PodKey, PodUid


class ProgressSink(Protocol):
    """Where the notice socket's service hands a report from a pod it identified."""

    def report(self, key: PodKey, uid: PodUid, progress: Progress) -> None:
        """``progress`` is the newest report of the pod ``key`` (``uid``); never blocks."""


@dataclass(slots=True)
class _Entry:
    key: PodKey
    #: The newest report not yet written (None: nothing new).
    pending: Progress | None = None
    writing: bool = False
    #: No write before this (monotonic): the interval after the last one started.
    not_before: float = 0.0


@dataclass(frozen=True, slots=True)
class Due:
    """One write to make: ``progress`` on the pod ``key`` (``uid``)."""

    key: PodKey
    uid: PodUid
    progress: Progress


class ProgressLedger:
    """The newest report of each pod and when its next write may go (see the module)."""

    def __init__(self, interval: float = MIN_WRITE_INTERVAL_S) -> None:
        self.interval = interval
        self._pods: dict[PodUid, _Entry] = {}

    def __len__(self) -> int:
        return len(self._pods)

    def offer(self, key: PodKey, uid: PodUid, progress: Progress) -> None:
        """The pod's newest report; it replaces any report not yet written."""
        entry = self._pods.get(uid)
        if entry is None:
            entry = self._pods[uid] = _Entry(key)
        entry.key = key
        entry.pending = progress

    def due(self, now: float) -> list[Due]:
        """The writes to start now; each counts as started (call :meth:`written` or
        :meth:`failed` when it ends)."""
        started: list[Due] = []
        for uid, entry in self._pods.items():
            if entry.pending is None or entry.writing or now < entry.not_before:
                continue
            started.append(Due(entry.key, uid, entry.pending))
            entry.pending = None
            entry.writing = True
            entry.not_before = now + self.interval
        return started

    def next_due(self, now: float) -> float | None:
        """Seconds until the next write is due (0: one is due now); None when none waits."""
        waits = [
            max(0.0, entry.not_before - now)
            for entry in self._pods.values()
            if entry.pending is not None and not entry.writing
        ]
        return min(waits, default=None)

    def written(self, uid: PodUid) -> None:
        """The write started for the pod ended (written, or the pod is gone)."""
        entry = self._pods.get(uid)
        if entry is not None:
            entry.writing = False

    def failed(self, due: Due) -> None:
        """The write of ``due`` failed: the pod's newest report (``due``'s, unless a newer one
        came) waits for the interval after the failed write like any other."""
        entry = self._pods.get(due.uid)
        if entry is None:
            return
        entry.writing = False
        if entry.pending is None:
            entry.pending = due.progress

    def forget(self, uid: PodUid) -> None:
        """The pod left the node: drop what is kept of it."""
        self._pods.pop(uid, None)

    def keep_only(self, uids: set[PodUid]) -> list[PodUid]:
        """Forget every pod not in ``uids`` (the pods on the node now); returns those
        forgotten."""
        gone = [uid for uid in self._pods if uid not in uids]
        for uid in gone:
            del self._pods[uid]
        return gone

    def waiting(self, uid: PodUid) -> Progress | None:
        """The pod's report not yet written, if any."""
        entry = self._pods.get(uid)
        return None if entry is None else entry.pending
