"""The agent's core: which notices are live, and what is due at ``now``. Pure, no I/O.

State machine of a pod under notice (one per pod uid)::

    seen --NotifyPod--> notified --ack or deadline-evict_margin--> EvictPod --accepted--> evicted
                           |                                          | refused (PDB): retry
                           +--notice withdrawn--> WithdrawPod --> seen
    evict refused, or accepted before deadline-delete_margin --deadline-delete_margin-->
        DeletePod (last resort, once)

A notice first seen with less time than ``evict_margin`` (or past its deadline) is late: its pods
are evicted as soon as they are told, each :class:`~nodeagent.core.events.EvictPod` carrying a
:class:`~nodeagent.core.events.Late` the pod's Event words. A delete never comes first: only an
eviction refused (after ``evict_retry``) or accepted before the delete margin is followed by one,
so every pod gets the Eviction API's ``DisruptionTarget`` condition when it can.

``now`` is always the corrected clock's: deadlines from cloud metadata are absolute, real times,
so the caller adds its clock's measured offset (:mod:`nodeagent.wiring.clock`) before asking.

Notices come in as complete observations per channel (:meth:`Store.observe`): an id seen before
is the same notice (deduplicated; its deadline may only move earlier), an id missing from a
later observation of the same channel was withdrawn. Failed polls are simply not observations.

Adapters ask :meth:`Store.due` for the actions due at ``now``, carry them out, and report each
result with :meth:`Store.record`; an action that failed stays due. Training workers are evicted
first; other pods only once no worker is left under the same notice (or at the deadline margin).

The store is the one owner of a notice from detection to eviction, and lets go of what it keeps
with its notice or its pod: when each notice was detected (:meth:`Store.detected_at`), when each
pod's workers were first told (:meth:`Store.told_at`), which notices the node has drained under
(:meth:`Store.newly_drained`). Those moments are the caller's monotonic seconds, kept only for it
to time what follows; the store never compares them with ``now``.

Each pod follows the most urgent disruptive notice that concerns it: a node-wide one, or one
scoped to it (a failed GPU, the scheduler's reclaim). Only node-wide notices taint and annotate
the node.

The scheduler's reclaim (:func:`reclaim_notice`, read from the pod's own annotations) is the
scheduler's to carry out: it wrote the pod's ``shoal.dev/leave-by`` and evicts the pod then. The
agent tells the workers (its annotation does not count as telling them), evicts a worker early
once it acknowledged, and otherwise leaves the pod to the scheduler: no eviction at the margin,
no last-resort delete.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum

from contracts import names
from contracts.times import utc
from nodeagent.core.events import (
    RECLAIM_CHANNEL,
    SCHEDULER_SOURCE,
    AckUpstream,
    Action,
    DeletePod,
    EventId,
    EvictPod,
    Kind,
    Late,
    Notice,
    NotifyPod,
    Pod,
    PodKey,
    PodUid,
    SyncNode,
    Tracked,
    WithdrawPod,
    rfc3339,
)


@dataclass(frozen=True, slots=True)
class Settings:
    """Timing policy. Margins are measured back from a notice's deadline."""

    #: Workers that have not acknowledged are evicted this long before the deadline.
    evict_margin: timedelta = timedelta(seconds=15)
    #: Pods still there this long before the deadline are deleted with a short grace period.
    delete_margin: timedelta = timedelta(seconds=5)
    #: Pods that are not workers are not evicted earlier than this before the deadline.
    drain_lead: timedelta = timedelta(minutes=10)
    #: An eviction refused (e.g. by a PodDisruptionBudget) is retried after this long.
    evict_retry: timedelta = timedelta(seconds=5)


class AckOutcome(StrEnum):
    ACCEPTED = "accepted"
    NOT_ON_NODE = "not-on-node"
    NOT_UNDER_NOTICE = "not-under-notice"


#: The actions on one pod.
PodAction = NotifyPod | WithdrawPod | EvictPod | DeletePod


@dataclass(slots=True)
class _PodState:
    pod: Pod
    #: (event id, deadline) the pod was last told about; None when not under notice.
    notified: tuple[EventId, datetime] | None = None
    #: The workers heard the notice over gRPC (which goes out before the annotation is written).
    heard: tuple[EventId, datetime] | None = None
    #: When the workers were first told over gRPC (the caller's monotonic seconds), until they
    #: are told of a withdrawal.
    told_at: float | None = None
    acked_step: int | None = None
    evict_attempted_at: datetime | None = None
    evicted: bool = False
    delete_attempted_at: datetime | None = None
    deleted: bool = False

    def out(self) -> bool:
        """The pod is on its way out (eviction accepted, deleted, or being deleted)."""
        return self.evicted or self.deleted or self.pod.leaving

    def record(self, action: PodAction, *, ok: bool, now: datetime) -> None:
        """The outcome of an action on this pod: an attempt to evict or delete counts whatever
        its outcome (it is retried after ``evict_retry``), the rest only once done."""
        match action:
            case NotifyPod(notice=notice):
                if ok:
                    self.notified = (notice.event_id, notice.deadline)
            case WithdrawPod():
                if ok:
                    self.notified = None
                    self.heard = None
                    self.acked_step = None
            case EvictPod():
                self.evict_attempted_at = now
                self.evicted = self.evicted or ok
            case DeletePod():
                self.delete_attempted_at = now
                self.deleted = self.deleted or ok


def _workers_left(
    states: Iterable[_PodState], governs: dict[PodUid, Notice | None]
) -> set[EventId]:
    """The notices that still have a training worker to get out (other pods wait for them)."""
    return {
        notice.event_id
        for st in states
        if st.pod.worker and not st.pod.daemon and not st.out()
        for notice in (governs[st.pod.uid],)
        if notice is not None
    }


def reclaim_notice(pod: Pod) -> Notice | None:
    """The scheduler's reclaim of ``pod``, when its annotations carry one: a notice for this pod
    only, due at its ``shoal.dev/leave-by``. A new leave-by time is a new notice."""
    if pod.reclaimed_for is None or pod.leave_by is None or pod.daemon:
        return None
    deadline = _whole_seconds(pod.leave_by)
    return Notice(
        event_id=EventId(f"reclaim-{pod.uid}-{int(deadline.timestamp())}"),
        source=SCHEDULER_SOURCE,
        channel=RECLAIM_CHANNEL,
        kind=Kind.RECLAIM,
        deadline=deadline,
        reason=f"reclaimed for gang {pod.reclaimed_for}",
        scope=frozenset({pod.key}),
    )


@dataclass(frozen=True, slots=True)
class ShortNotice:
    """A notice that gives a pod less time than its checkpoint takes: ``given`` whole seconds
    from when the pod is told to the notice's deadline, ``needed`` what the pod declares
    (``shoal.dev/checkpoint-seconds``)."""

    given: int
    needed: float

    def message(self, notice: Notice) -> str:
        """What the pod's Event says: the two figures and what is lost."""
        return (
            f"The notice gives {self.given} s (leave by {rfc3339(notice.deadline)}, "
            f"{notice.source} {notice.kind.value}) but the checkpoint takes {self.needed:g} s "
            f"({names.CHECKPOINT_SECONDS_ANNOTATION}): a checkpoint started now cannot complete "
            "in time, so the work since the pod's last complete checkpoint will be lost"
        )


def short_notice(pod: Pod, notice: Notice, now: datetime) -> ShortNotice | None:
    """Whether ``notice``, told to ``pod`` at ``now``, gives it less time than its checkpoint
    takes; None when the pod declares no checkpoint time or the notice gives enough."""
    if pod.checkpoint_seconds is None:
        return None
    given = max(0, math.floor((notice.deadline - utc(now)).total_seconds()))
    if given >= pod.checkpoint_seconds:
        return None
    return ShortNotice(given=given, needed=pod.checkpoint_seconds)


def _whole_seconds(moment: datetime) -> datetime:
    """Deadlines are kept at second precision (as annotations store them), rounded down."""
    return utc(moment).replace(microsecond=0)


@dataclass(slots=True)
class Store:
    settings: Settings = field(default_factory=Settings)
    _notices: dict[EventId, Tracked] = field(default_factory=dict)
    _pods: dict[PodUid, _PodState] = field(default_factory=dict)
    _node_applied: tuple[tuple[EventId, datetime, bool], ...] = ()
    #: When each live notice was detected (the caller's monotonic seconds); let go with it.
    _detected: dict[EventId, float] = field(default_factory=dict)
    #: The live notices the node has drained under (said once each); let go with them.
    _drained: set[EventId] = field(default_factory=set)

    # --- inputs -----------------------------------------------------------------------------

    def restore(self, tracked: Iterable[Tracked]) -> None:
        """Start from what the node annotation recorded (the agent restarted mid-notice).

        The recorded first-seen time and upstream ack win over a fresh observation of the same
        notice; the node is taken to show exactly the recorded notices.
        """
        restored: list[Tracked] = []
        for item in tracked:
            notice = replace(item.notice, deadline=_whole_seconds(item.notice.deadline))
            restored.append(replace(item, notice=notice))
            seen = self._notices.get(notice.event_id)
            if seen is not None and seen.notice.deadline < notice.deadline:
                notice = seen.notice
            self._notices[notice.event_id] = replace(item, notice=notice)
        restored.sort(key=lambda t: (t.notice.deadline, t.notice.event_id))
        self._node_applied = self._node_key(tuple(t for t in restored if t.notice.scope is None))
        for state in self._pods.values():
            if state.notified is None:
                state.notified = self._told_before(state.pod)

    def _told_before(self, pod: Pod) -> tuple[EventId, datetime] | None:
        """The notice a pod's own ``leave-by`` annotation shows it was already told about (the
        scheduler's reclaim is not: the scheduler wrote that annotation, not the agent)."""
        governing = self.governing_for(pod)
        if (
            governing is not None
            and not governing.reclaim
            and pod.leave_by is not None
            and _whole_seconds(pod.leave_by) == governing.deadline
        ):
            return (governing.event_id, governing.deadline)
        return None

    def observe(
        self,
        channel: str,
        notices: Iterable[Notice],
        now: datetime,
        *,
        detected: float | None = None,
    ) -> list[EventId]:
        """A complete, successful read of ``channel``. Returns the ids that are new; ``detected``
        (the caller's monotonic seconds) is kept as their detection time."""
        seen: dict[EventId, Notice] = {}
        for notice in notices:
            if notice.channel != channel:
                raise ValueError(
                    f"notice {notice.event_id} is from {notice.channel}, not {channel}"
                )
            seen[notice.event_id] = replace(notice, deadline=_whole_seconds(notice.deadline))
        withdrawn = [
            i for i, t in self._notices.items() if t.notice.channel == channel and i not in seen
        ]
        for gone in withdrawn:
            del self._notices[gone]
            self._detected.pop(gone, None)
            self._drained.discard(gone)
        if withdrawn:
            self._forget_acks()
        new: list[EventId] = []
        for event_id, notice in seen.items():
            known = self._notices.get(event_id)
            if known is None:
                self._notices[event_id] = Tracked(notice=notice, first_seen=utc(now))
                new.append(event_id)
                if detected is not None:
                    self._detected[event_id] = detected
            elif notice.deadline < known.notice.deadline:
                self._notices[event_id] = replace(known, notice=notice)
        return new

    def _forget_acks(self) -> None:
        """A pod under no live notice any more keeps no ack and nothing heard: neither may
        hasten its departure under a later notice. (``notified`` stays until the pod is told
        of the withdrawal.)"""
        for state in self._pods.values():
            if (state.heard is not None or state.acked_step is not None) and not self._live_for(
                state.pod
            ):
                state.heard = None
                state.acked_step = None

    def set_pods(self, pods: Iterable[Pod]) -> None:
        """The pods now bound to this node (a complete list). Pods not listed have left."""
        current = {pod.uid: pod for pod in pods}
        for uid in [u for u in self._pods if u not in current]:
            del self._pods[uid]
        for uid, pod in current.items():
            state = self._pods.get(uid)
            if state is None or state.pod.key != pod.key:
                # A restarted agent finds its own earlier notice on the pod: not repeated. (A uid
                # known under another name came from a stale pod file: nothing of it is kept.)
                self._pods[uid] = _PodState(pod=pod, notified=self._told_before(pod))
            else:
                # A pod that opened a notice watch stays a worker (mark_worker), whatever the
                # new copy's labels say.
                state.pod = replace(pod, worker=True) if state.pod.worker else pod
                if state.notified is None:
                    # Known before from the pod file, whose copy predates the annotation.
                    state.notified = self._told_before(pod)

    def acknowledge(self, key: PodKey, uid: PodUid, step: int) -> AckOutcome:
        """A worker says it checkpointed at ``step``. Only speeds up a pod already under notice:
        one told (over gRPC or by annotation) of a notice that is live and concerns it."""
        state = self._pods.get(uid)
        if state is None or state.pod.key != key:
            return AckOutcome.NOT_ON_NODE
        # Under notice: told about a notice that is still live and still concerns the pod
        # (``notified`` outlives a withdrawal until the pod has been told of it).
        told = {t[0] for t in (state.notified, state.heard) if t is not None}
        if not told & self._live_for(state.pod):
            return AckOutcome.NOT_UNDER_NOTICE
        state.acked_step = step
        return AckOutcome.ACCEPTED

    def _live_for(self, pod: Pod) -> set[EventId]:
        """The live disruptive notices that concern ``pod``."""
        return {
            i
            for i, t in self._notices.items()
            if t.notice.disruptive and (t.notice.scope is None or pod.key in t.notice.scope)
        }

    def heard(self, uid: PodUid, notice: Notice, *, at: float | None = None) -> bool:
        """The pod's workers were told about ``notice`` (they may acknowledge from now on).
        Returns False when they had already been told exactly this (nothing new to send).
        ``at`` (the caller's monotonic seconds) is kept as when they were first told."""
        state = self._pods.get(uid)
        if state is None:
            return False
        told = (notice.event_id, notice.deadline)
        if state.heard == told:
            return False
        state.heard = told
        if state.told_at is None:
            state.told_at = at
        return True

    def unheard(self) -> list[tuple[PodUid, Notice]]:
        """Pods told of their governing notice by annotation whose workers have not heard it
        over the socket: an agent restarted under a live notice restores ``notified`` from the
        pod's ``leave-by`` (so no :class:`NotifyPod` is due), and a worker whose watch opened
        before the notice was restored got "no notice" first thing; it must be told now."""
        found: list[tuple[PodUid, Notice]] = []
        for uid, state in self._pods.items():
            if state.pod.daemon or state.out() or state.notified is None:
                continue
            governing = self.governing_for(state.pod)
            told = None if governing is None else (governing.event_id, governing.deadline)
            if governing is not None and state.notified == told and state.heard != told:
                found.append((uid, governing))
        return found

    def told_withdrawal(self, uid: PodUid) -> None:
        """The pod's workers were told that their notice was withdrawn: the next notice they
        are told is timed afresh."""
        state = self._pods.get(uid)
        if state is not None:
            state.told_at = None

    def mark_worker(self, uid: PodUid) -> None:
        """The pod opened a notice watch: it is a training worker whatever its labels say."""
        state = self._pods.get(uid)
        if state is not None and not state.pod.worker:
            state.pod = replace(state.pod, worker=True)

    # --- queries ------------------------------------------------------------------------------

    def active(self) -> tuple[Tracked, ...]:
        """Live notices, most urgent first."""
        return tuple(
            sorted(self._notices.values(), key=lambda t: (t.notice.deadline, t.notice.event_id))
        )

    def governing(self) -> Notice | None:
        """The most urgent disruptive notice for the whole node."""
        for tracked in self.active():
            if tracked.notice.disruptive and tracked.notice.scope is None:
                return tracked.notice
        return None

    def governing_for(self, pod: Pod) -> Notice | None:
        """The most urgent disruptive notice that concerns ``pod``: the one it is told about."""
        for tracked in self.active():
            scope = tracked.notice.scope
            if tracked.notice.disruptive and (scope is None or pod.key in scope):
                return tracked.notice
        return None

    def node_wide(self) -> tuple[Tracked, ...]:
        """Live notices for the whole node (what its taint and annotation show)."""
        return tuple(t for t in self.active() if t.notice.scope is None)

    def pod_notice(self, uid: PodUid) -> Notice | None:
        """The notice a pod has been told about, by annotation or over gRPC only (while the API
        server cannot be written); None when it is not under notice."""
        state = self._pods.get(uid)
        if state is None:
            return None
        told = [t[0] for t in (state.notified, state.heard) if t is not None]
        if not told:
            return None
        governing = self.governing_for(state.pod)
        if governing is not None and governing.event_id in told:
            return governing
        for event_id in told:
            tracked = self._notices.get(event_id)
            if tracked is not None:
                return tracked.notice
        return None

    def detected_at(self, event_id: EventId) -> float | None:
        """When the live notice was detected (the caller's monotonic seconds), if it was."""
        return self._detected.get(event_id)

    def told_at(self, uid: PodUid) -> float | None:
        """When the pod's workers were first told of their notice (the caller's monotonic
        seconds); None when they were not, or were told of its withdrawal since."""
        state = self._pods.get(uid)
        return state.told_at if state is not None else None

    def newly_drained(self) -> Notice | None:
        """The governing notice, the first time every pod it concerns is out: the node has
        drained under it (once per event id while the notice is live)."""
        governing = self.governing()
        if governing is None or governing.event_id in self._drained or not self.pods_out():
            return None
        self._drained.add(governing.event_id)
        return governing

    def footprint(self) -> dict[str, int]:
        """How many notices and pods the store holds something for, and how many detection
        times, first-told times and drained notices it keeps: each is bounded by the notices
        live and the pods bound now, never by all it ever saw."""
        return {
            "notices": len(self._notices),
            "pods": len(self._pods),
            "detected": len(self._detected),
            "told": sum(st.told_at is not None for st in self._pods.values()),
            "drained": len(self._drained),
        }

    def pods_out(self) -> bool:
        """Every pod that is not a daemon is on its way out (or there are none)."""
        return all(st.pod.daemon or st.out() for st in self._pods.values())

    def pod_report(self) -> list[dict[str, object]]:
        """What the store knows of each pod (for ``/status``)."""
        return [
            {
                "pod": st.pod.key,
                "worker": st.pod.worker,
                "daemon": st.pod.daemon,
                "notified": st.notified[0] if st.notified else None,
                "acked_step": st.acked_step,
                "evicted": st.evicted,
                "deleted": st.deleted,
                "leaving": st.pod.leaving,
            }
            for st in sorted(self._pods.values(), key=lambda st: st.pod.key)
        ]

    def pod(self, uid: PodUid) -> Pod | None:
        state = self._pods.get(uid)
        return state.pod if state is not None else None

    def pods(self) -> tuple[Pod, ...]:
        """The pods bound to this node, as last set."""
        return tuple(state.pod for state in self._pods.values())

    @staticmethod
    def _node_key(active: tuple[Tracked, ...]) -> tuple[tuple[EventId, datetime, bool], ...]:
        return tuple((t.notice.event_id, t.notice.deadline, t.upstream_acked) for t in active)

    def due(self, now: datetime) -> list[Action]:
        """Every action due at ``now``, in the order to carry them out: the node first, then
        each pod (by key), then the cloud's acknowledgements."""
        now = utc(now)
        actions: list[Action] = []
        wide = self.node_wide()
        if self._node_key(wide) != self._node_applied:
            actions.append(SyncNode(wide))
        states = sorted(self._pods.values(), key=lambda st: st.pod.key)
        governs = {st.pod.uid: self.governing_for(st.pod) for st in states}
        workers_left = _workers_left(states, governs)
        for st in states:
            action = self._pod_due(st, governs[st.pod.uid], workers_left, now)
            if action is not None:
                actions.append(action)
        actions.extend(self._upstream_due(states))
        return actions

    def _pod_due(
        self, st: _PodState, governing: Notice | None, workers_left: set[EventId], now: datetime
    ) -> PodAction | None:
        """What is due for one pod: told first, then evicted, deleted as a last resort;
        told again when its notice is withdrawn. DaemonSet pods are left alone."""
        if st.pod.daemon:
            return None
        if governing is None:
            return WithdrawPod(st.pod) if st.notified is not None and not st.out() else None
        if st.notified != (governing.event_id, governing.deadline):
            return None if st.out() else NotifyPod(st.pod, governing)
        if governing.reclaim:
            return self._reclaim_due(st, governing, now)
        return self._told_due(st, governing, workers_left, now)

    def _told_due(
        self, st: _PodState, governing: Notice, workers_left: set[EventId], now: datetime
    ) -> PodAction | None:
        """What is due for a pod told of ``governing``: evicted, deleted as a last resort."""
        if now >= governing.deadline - self.settings.delete_margin and self._last_resort(
            st, governing, now
        ):
            return DeletePod(st.pod, governing)
        if st.out() or not self._retry_ok(st.evict_attempted_at, now):
            return None
        why = self._evict_reason(st, governing, governing.event_id in workers_left, now)
        return None if why is None else EvictPod(st.pod, governing, why, self.late(governing))

    def _last_resort(self, st: _PodState, governing: Notice, now: datetime) -> bool:
        """At the delete margin a pod still there is deleted with a short grace period, once
        the Eviction API had its chance: after an eviction refused (and ``evict_retry``), or to
        shorten the grace of one accepted before the margin (or of a pod deleted by someone
        else). A pod not evicted yet is evicted first, even past the deadline."""
        if st.deleted or not self._retry_ok(st.delete_attempted_at, now):
            return False
        attempted = st.evict_attempted_at
        if attempted is None:
            return st.pod.leaving
        if st.evicted:
            return attempted < governing.deadline - self.settings.delete_margin
        return self._retry_ok(attempted, now)

    def late(self, notice: Notice) -> Late | None:
        """How late ``notice`` came, when it was first seen with less than the evict margin
        left (or none at all); None for a notice seen in time, and for the scheduler's reclaim
        (its leave-by is the scheduler's to keep)."""
        tracked = self._notices.get(notice.event_id)
        if tracked is None or notice.reclaim:
            return None
        margin = self.settings.evict_margin
        if tracked.first_seen > notice.deadline - margin:
            return Late(notice=notice, seen=tracked.first_seen, margin=margin)
        return None

    def _reclaim_due(self, st: _PodState, governing: Notice, now: datetime) -> PodAction | None:
        """Under the scheduler's reclaim a pod is evicted by the agent only once its worker
        acknowledged; the eviction at the deadline is the scheduler's."""
        if st.out() or st.acked_step is None or not self._retry_ok(st.evict_attempted_at, now):
            return None
        return EvictPod(st.pod, governing, "acknowledged")

    def _evict_reason(
        self, st: _PodState, governing: Notice, workers_left: bool, now: datetime
    ) -> str | None:
        """Why a told pod is evicted now, if it is: a worker once it acknowledged or at the
        evict margin; another pod at the margin, or once no worker is left under its notice
        (never earlier than the drain lead)."""
        s = self.settings
        at_margin = now >= governing.deadline - s.evict_margin
        if st.pod.worker:
            if st.acked_step is not None:
                return "acknowledged"
            return "deadline" if at_margin else None
        drained = not workers_left and now >= governing.deadline - s.drain_lead
        return "drain" if at_margin or drained else None

    def _upstream_due(self, states: list[_PodState]) -> list[Action]:
        """The cloud is acknowledged once every pod is out or acknowledged."""
        everyone_out = all(
            st.pod.daemon or st.out() or (st.notified is not None and st.acked_step is not None)
            for st in states
        )
        if not everyone_out:
            return []
        return [
            AckUpstream(t.notice)
            for t in self.active()
            if t.notice.disruptive and t.notice.upstream_id is not None and not t.upstream_acked
        ]

    def _retry_ok(self, attempted: datetime | None, now: datetime) -> bool:
        return attempted is None or now >= attempted + self.settings.evict_retry

    def next_change(self, now: datetime) -> datetime | None:
        """The next moment after ``now`` when something may become due without any new input."""
        s = self.settings
        moments: list[datetime] = []
        for tracked in self.active():
            if tracked.notice.disruptive and not tracked.notice.reclaim:
                deadline = tracked.notice.deadline
                moments += [
                    deadline - s.drain_lead,
                    deadline - s.evict_margin,
                    deadline - s.delete_margin,
                ]
        for st in self._pods.values():
            for attempted in (st.evict_attempted_at, st.delete_attempted_at):
                if attempted is not None:
                    moments.append(attempted + s.evict_retry)
        later = [m for m in moments if m > utc(now)]
        return min(later, default=None)

    # --- results --------------------------------------------------------------------------------

    def record(self, action: Action, *, ok: bool, now: datetime) -> None:
        """The outcome of carrying out ``action``. A failed action stays due."""
        now = utc(now)
        match action:
            case SyncNode(notices=notices):
                if ok:
                    self._node_applied = self._node_key(notices)
            case AckUpstream(notice=notice):
                tracked = self._notices.get(notice.event_id)
                if ok and tracked is not None:
                    self._notices[notice.event_id] = replace(tracked, upstream_acked=True)
            case NotifyPod(pod=pod) | WithdrawPod(pod=pod) | EvictPod(pod=pod) | DeletePod(pod=pod):
                state = self._pods.get(pod.uid)
                if state is not None:
                    state.record(action, ok=ok, now=now)
