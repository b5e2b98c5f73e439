"""What the web view shows, held between the scheduling loop and the page.

The loop hands over references only (:meth:`Feed.observe`: the snapshot and the gangs it has
just built, once per cycle) and the reporter's calls are copied into small bounded records
(:class:`Tee`), so the loop pays a lock and an assignment. At most every
:data:`BOUNDS_EVERY` seconds it also compares each gang's bounds with the ones it had the
time before (:func:`state.bound_changes`), so that each gang's bound changes are kept whether or
not a page is open: a cost per gang (about 0.2 µs), paid at most twice a second rather than
every cycle; a change undone within that time is not kept. The document is built later, off the
loop, by whoever asks (:meth:`Feed.document`, the server's publisher at most every
``--web-view`` interval), from the newest references.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from scheduler import torn as torn_core
from scheduler.cache.cache import Snapshot
from scheduler.gang import why
from scheduler.gang.group_status import GroupStatus
from scheduler.model import Gang, GangKey, InvalidGang, NodeName, PodGroup, PodRequest
from scheduler.runner import Reporter
from scheduler.web import state
from scheduler.web.state import Entry, Reason

#: Reasons kept for gangs the loop no longer reports (bounded; the oldest go first); as many
#: gangs' bound changes.
MAX_REASONS = 10_000
#: How often (seconds of the loop's ``now``) the gangs' bounds are compared.
BOUNDS_EVERY = 0.5


class Feed:
    def __init__(self, scheduler: str, *, clock: Callable[[], float] = time.time) -> None:
        self.scheduler = scheduler
        self._clock = clock
        self._lock = threading.Lock()
        self._latest: tuple[Snapshot, list[Gang], list[InvalidGang], float] | None = None
        self._reasons: dict[GangKey, Reason] = {}
        self._timeline: deque[Entry] = deque(maxlen=state.TIMELINE_LENGTH)
        # Only the loop (``observe``) reads and replaces these: each gang's bounds when last
        # compared, and when that was.
        self._bounds: dict[GangKey, state.Bounds] = {}
        self._bounds_at = -float("inf")
        self._bound_history: dict[GangKey, deque[Entry]] = {}
        #: Grows with every change; the publisher builds a document only when it moved.
        self.version = 0
        # Only the builder (one caller at a time: the server's publisher) reads these.
        self._built_from: Snapshot | None = None
        self._memo = state.NodeMemo()

    # -- from the loop and the reporter's callers (any thread) ------------------------------------
    def observe(
        self, snapshot: Snapshot, gangs: list[Gang], invalid: list[InvalidGang], now: float
    ) -> None:
        """From the loop only, once per cycle."""
        changed: list[Entry] = []
        if now - self._bounds_at >= BOUNDS_EVERY:
            self._bounds_at = now
            self._bounds, changed = state.bound_changes(self._bounds, gangs, now)
        with self._lock:
            self._latest = (snapshot, gangs, invalid, now)
            for entry in changed:
                self._bound_change(entry)
            self.version += 1

    def _bound_change(self, entry: Entry) -> None:
        assert entry.gang is not None
        gang = GangKey(entry.gang)
        kept = self._bound_history.pop(gang, None)  # re-inserted: the newest last
        if kept is None:
            if len(self._bound_history) >= MAX_REASONS:
                self._bound_history.pop(next(iter(self._bound_history)))
            kept = deque(maxlen=state.BOUND_CHANGES)
        kept.append(entry)
        self._bound_history[gang] = kept
        self._timeline.append(Entry(entry.at, "bounds", f"{gang} {entry.text}", gang=gang))

    def reason(self, gang: GangKey, message: str, waiting: bool, code: str = "") -> None:
        with self._lock:
            if len(self._reasons) >= MAX_REASONS:
                self._reasons.pop(next(iter(self._reasons)))
            self._reasons[gang] = Reason(message, waiting, self._clock(), code)
            self.version += 1

    def record(self, kind: str, text: str, **where: str | None) -> None:
        with self._lock:
            self._timeline.append(Entry(self._clock(), kind, text, **where))
            self.version += 1

    # -- from the server ---------------------------------------------------------------------------
    def document(self) -> dict[str, Any] | None:
        """The newest document (``None`` before the loop's first cycle); call from one thread
        at a time (it compares each snapshot with the one before it for the timeline)."""
        with self._lock:
            latest = self._latest
            reasons = dict(self._reasons)
            history = {k: tuple(v) for k, v in self._bound_history.items()}
        if latest is None:
            return None
        snapshot, gangs, invalid, now = latest
        if snapshot is not self._built_from:
            found = state.changes(self._built_from, snapshot, self._clock())
            self._built_from = snapshot
            if found:
                with self._lock:
                    self._timeline.extend(found)
        with self._lock:
            timeline = list(self._timeline)
        return state.document(
            self.scheduler,
            snapshot,
            gangs=gangs,
            invalid=invalid,
            reasons=reasons,
            timeline=timeline,
            now=now,
            memo=self._memo,
            bound_history=history,
        )


class Tee:
    """A :class:`Reporter` that tells ``inner`` everything and the feed what the page shows."""

    def __init__(self, inner: Reporter, feed: Feed) -> None:
        self.inner = inner
        self.feed = feed

    def unschedulable(
        self, gang: Gang, pods: Sequence[PodRequest], message: str, *, waiting: bool = False
    ) -> None:
        self.inner.unschedulable(gang, pods, message, waiting=waiting)
        self.feed.reason(gang.key, message, waiting, why.told_reason(gang, waiting))

    def scheduled(self, gang: Gang, pod: PodRequest, node: NodeName) -> None:
        self.inner.scheduled(gang, pod, node)
        self.feed.record(
            "bind", f"{pod.key} bound to {node}", gang=gang.key, pod=pod.key, node=node
        )

    def bind_failed(self, pod: PodRequest, node: NodeName, error: str) -> None:
        self.inner.bind_failed(pod, node, error)

    def asked_to_leave(self, pod: PodRequest, gang: Gang, leave_by: float, why: str = "") -> None:
        self.inner.asked_to_leave(pod, gang, leave_by, why)
        self.feed.record(
            "reclaim",
            f"{pod.key} on {pod.node} asked to leave for {gang.key}",
            gang=gang.key,
            pod=pod.key,
            node=pod.node,
        )

    def nominated(self, pod: PodRequest, node: NodeName) -> None:
        self.inner.nominated(pod, node)

    def invalid(self, gang: InvalidGang) -> None:
        self.inner.invalid(gang)

    def group_status(self, group: PodGroup, status: GroupStatus) -> None:
        self.inner.group_status(group, status)

    def gang_status(self, gang: Gang) -> None:
        self.inner.gang_status(gang)

    def torn(self, gang: Gang, release_at: float) -> None:
        self.inner.torn(gang, release_at)
        message = torn_core.below_minimum_message(
            gang.name, torn_core.Shortfall.of(gang), release_at
        )
        self.feed.reason(gang.key, message, False, "GangBelowMinimum")
        self.feed.record("torn", f"{gang.key} below its minimum with members bound", gang=gang.key)

    def released(self, gang: Gang, since: float, leave_by: float) -> None:
        self.inner.released(gang, since, leave_by)
        self.feed.record("released", f"{gang.key} stayed torn: members released", gang=gang.key)
