"""The scheduling loop: snapshot, decide one gang, assume, bind concurrently, report.

This module wires the pure core to the outside through two protocols — a :class:`Binder` and a
:class:`Reporter` — so it imports no client library. Informers feed the cache and call
:meth:`Runner.wake`; the loop sleeps when no gang is ready and wakes on the next event or when
the earliest backoff ends.

Every failure path undoes its reservation: a binding that fails is forgotten in the cache (the
pod is charged to no node), and the gang is retried in a later cycle for what it still lacks.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from scheduler.cache import Cache
from scheduler.cache.cache import Snapshot
from scheduler.cycle import Config, Decision, decide_in_turn, has_work
from scheduler.gang import GangBuilder
from scheduler.gang.group_status import GroupStatus, GroupStatuses
from scheduler.metrics import Metrics
from scheduler.model import (
    Assignment,
    Gang,
    GangKey,
    GroupApi,
    InvalidGang,
    NodeName,
    PodGroup,
    PodKey,
    PodRequest,
    split_group_ref,
)
from scheduler.queue import GangQueue
from scheduler.reclaim_ledger import ReclaimLedger, Room
from scheduler.torn import Torn, TornLedger

log = structlog.get_logger("scheduler")

#: scheduler-plugins' PodGroups get their status from :class:`GroupStatuses`; the other kinds
#: from the gang (``Reporter.gang_status``).
SP = GroupApi.SCHEDULER_PLUGINS


class Binder(Protocol):
    """Writes that carry out decisions. Each returns ``None`` on success, else why it failed;
    each blocks (the runner calls them from its worker pool)."""

    def bind(self, pod: PodRequest, node: NodeName) -> str | None: ...

    def ask_to_leave(self, pod: PodRequest, leave_by: float, gang: GangKey) -> str | None:
        """Annotate ``shoal.dev/leave-by`` (and whom the room is for) on a reclaimed pod."""

    def evict(self, pod: PodRequest) -> str | None:
        """Evict through the Eviction API (the pod gets the DisruptionTarget condition)."""


class Reporter(Protocol):
    """Where users look: pod conditions, Events, PodGroup status. Implementations must not
    block the caller for long and must tolerate repeated calls with the same content."""

    def unschedulable(
        self, gang: Gang, pods: Sequence[PodRequest], message: str, *, waiting: bool = False
    ) -> None:
        """``pods`` of ``gang`` could not be placed, for the reason ``message``; ``waiting``:
        only because the gang lacks members (not a failure)."""

    def scheduled(self, gang: Gang, pod: PodRequest, node: NodeName) -> None: ...

    def bind_failed(self, pod: PodRequest, node: NodeName, error: str) -> None: ...

    def asked_to_leave(self, pod: PodRequest, gang: Gang, leave_by: float) -> None: ...

    def nominated(self, pod: PodRequest, node: NodeName) -> None:
        """Room on ``node`` is held for ``pod`` (``status.nominatedNodeName``)."""

    def invalid(self, gang: InvalidGang) -> None: ...

    def group_status(self, group: PodGroup, status: GroupStatus) -> None:
        """The scheduler-plugins PodGroup ``group`` should have ``status`` (called on every
        cycle; send what changed)."""

    def gang_status(self, gang: Gang) -> None:
        """``gang``'s Volcano or Kubernetes PodGroup should show it (called on every cycle for
        those gangs; send what changed)."""

    def torn(self, gang: Gang, release_at: float) -> None:
        """``gang`` has bound members but fewer than its minimum and cannot be completed now;
        they are asked to leave at ``release_at`` unless the missing members bind. Called again
        when what it says changes (its surviving members, its counts)."""

    def released(self, gang: Gang, since: float, leave_by: float) -> None:
        """``gang`` stayed torn since ``since``: its bound members are asked to leave by
        ``leave_by`` and evicted once they acknowledge, or then."""


#: Told each cycle's snapshot and the gangs built from it (valid, invalid) at ``now``: must
#: only keep references (the web view's feed, docs/web-view.md).
Observer = Callable[[Snapshot, list[Gang], list[InvalidGang], float], None]


@dataclass(frozen=True, slots=True)
class Settings:
    scheduler_name: str
    bind_workers: int = 64
    config: Config = field(default_factory=Config)
    initial_backoff: float = 1.0
    max_backoff: float = 10.0
    #: The longest the loop sleeps with nothing to do.
    idle_wait: float = 5.0
    #: One cycle decides for up to this many gangs in turn on its snapshot (each on the room
    #: the ones before it left), for at most ``batch_seconds``: building the snapshot and the
    #: gangs is paid once per cycle, not once per gang.
    batch_decisions: int = 64
    batch_seconds: float = 0.1
    #: Seconds between asking a reclaimed pod to leave and evicting it.
    reclaim_grace: float = 30.0
    #: Room held for a gang after its victims were chosen, beyond the grace.
    hold_extra: float = 120.0
    #: How long a gang may stay torn (bound members, fewer than its minimum) waiting for the
    #: missing members before its bound members are released (see :mod:`scheduler.torn`).
    torn_grace: float = 60.0


class Runner:
    def __init__(
        self,
        cache: Cache,
        binder: Binder,
        reporter: Reporter,
        settings: Settings,
        metrics: Metrics | None = None,
        *,
        clock: Callable[[], float] = time.time,
        executor: Executor | None = None,
        observe: Observer | None = None,
    ) -> None:
        self.cache = cache
        self.binder = binder
        self.reporter = reporter
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.queue = GangQueue(
            initial_backoff=settings.initial_backoff, max_backoff=settings.max_backoff
        )
        self._clock = clock
        self._observe = observe
        self._wakeup = threading.Event()
        self._freed = threading.Event()
        self._binds = executor or ThreadPoolExecutor(
            max_workers=max(1, settings.bind_workers), thread_name_prefix="bind"
        )
        self._cycle = 0
        #: ``time.monotonic()`` when the loop last finished a cycle (or waited, not ready):
        #: ``/healthz`` fails when this grows old.
        self.completed_at = time.monotonic()
        self._torn = TornLedger(settings.torn_grace)
        self._statuses = GroupStatuses(settings.scheduler_name)
        self._invalid_seen: dict[str, str] = {}
        self._gangs = GangBuilder(settings.scheduler_name)
        self.in_flight = 0
        self._lock = threading.Lock()
        #: Victims, evictions in flight and room held per gang; read and written under the
        #: runner's lock (evictions finish on worker threads).
        self.reclaims = ReclaimLedger(settings.reclaim_grace, settings.hold_extra)
        # Gangs whose binding failed since the last cycle (written by bind threads): they back
        # off like a gang that did not fit, so a throttled or failing API server is not
        # hammered with immediate retries.
        self._bind_failed: list[tuple[GangKey, float]] = []

    def wake(self, *, freed: bool = False) -> None:
        """Something changed; ``freed`` when room may have appeared (ends every backoff)."""
        if freed:
            self._freed.set()
        self._wakeup.set()

    def run(self, stop: threading.Event, ready: Callable[[], bool] = lambda: True) -> None:
        """Cycle until ``stop`` is set; ``ready`` gates scheduling (caches synced, leadership)."""
        while not stop.is_set():
            if not ready():
                self.completed_at = time.monotonic()
                self._wakeup.wait(0.2)
                self._wakeup.clear()
                continue
            self._wakeup.clear()
            try:
                decision, next_at = self.run_once()
            except Exception:
                log.exception("cycle_crashed", cycle=self._cycle)
                stop.wait(1.0)
                continue
            self.completed_at = time.monotonic()
            if decision is None:
                wait = self.settings.idle_wait
                if next_at is not None:
                    wait = max(0.01, min(wait, next_at - self._clock()))
                self._wakeup.wait(wait)

    def stalled(self, limit: float) -> str | None:
        """Why the loop counts as stuck (no cycle completed for ``limit`` seconds), if it is.

        A cycle that raises does not count as completed: a fault that fails every cycle makes
        ``/healthz`` fail, so that the scheduler is restarted instead of silently idle."""
        age = time.monotonic() - self.completed_at
        if age > limit:
            return f"no scheduling cycle has completed for {age:.0f} s"
        return None

    def close(self) -> None:
        self._binds.shutdown(wait=True)

    # -- one cycle ---------------------------------------------------------------------------------
    def run_once(self) -> tuple[Decision | None, float | None]:
        """One cycle; returns its decision (``None`` if no gang was ready) and, when idle, the
        time the earliest backoff ends."""
        started = time.perf_counter()
        now = self._clock()
        self._take_news(now)
        snapshot = self.cache.snapshot()
        gangs = self._read_gangs(snapshot, now)
        working = self._publish_state(gangs, snapshot, now)
        leaving, reserved = self._track_victims(gangs, snapshot.pods, now)
        self._track_torn(gangs, now)
        first = self._decide_batch(
            gangs,
            snapshot,
            now,
            started,
            reserved=reserved,
            leaving=leaving,
            pending_gangs=len(working),
        )
        if first is None:
            return None, self._next_due(working)
        return first, None

    def _take_news(self, now: float) -> None:
        """What happened since the last cycle: room freed (every backoff ends), bindings that
        failed (their gangs back off), assumed bindings never confirmed (forgotten)."""
        if self._freed.is_set():
            self._freed.clear()
            self.queue.wake()
        with self._lock:
            failed, self._bind_failed = self._bind_failed, []
        for gang_key, when in dict(failed).items():
            self.queue.failed(gang_key, when)
        for key in self.cache.expire(now):
            log.warning("assume_expired", pod=key)

    def _read_gangs(self, snapshot: Snapshot, now: float) -> list[Gang]:
        """The snapshot's gangs; invalid ones are reported, and gangs gone leave the queue."""
        gangs, invalid = self._gangs.build(
            snapshot.pods.values(), snapshot.pod_groups, snapshot.members
        )
        if self._observe is not None:
            self._observe(snapshot, gangs, invalid, now)
        self._report_invalid(invalid)
        self.queue.prune(g.key for g in gangs)
        return gangs

    def _publish_state(self, gangs: list[Gang], snapshot: Snapshot, now: float) -> list[Gang]:
        """Set the gauges, bring every PodGroup's status up to date; returns the gangs with
        work to do."""
        self.metrics.queue_entries.set(len(self.queue))
        self.metrics.cached_pods.set(len(snapshot.pods))
        self.metrics.binds_in_flight.set(self.in_flight)
        for group, status in self._statuses.due(_groups_with_pods(snapshot), now):
            self.reporter.group_status(group, status)
        for gang in gangs:
            if gang.pod_group is not None and split_group_ref(gang.pod_group)[0] is not SP:
                self.reporter.gang_status(gang)
        working = [g for g in gangs if has_work(g)]
        self.metrics.pending_gangs.set(len(working))
        return working

    def _decide_batch(
        self,
        gangs: list[Gang],
        snapshot: Snapshot,
        now: float,
        started: float,
        *,
        reserved: Mapping[GangKey, Room],
        leaving: Mapping[GangKey, int],
        pending_gangs: int,
    ) -> Decision | None:
        """Decide gangs in turn on the snapshot and carry out each decision, until one has
        victims or the batch is full; returns the first decision (``None``: none was ready)."""
        decide_started = time.perf_counter()
        with self._lock:
            spent = self.reclaims.spent()
        turn = decide_in_turn(
            gangs,
            self.queue,
            snapshot,
            now,
            self.settings.config,
            reserved=reserved,
            leaving=leaving,
            spent=spent,
        )
        first: Decision | None = None
        for count, decision in enumerate(turn, start=1):
            decided = time.perf_counter()
            first = first or decision
            self._cycle += 1
            self.metrics.decision_seconds.observe(decided - decide_started)
            self._carry_out(decision, snapshot.pods, now)
            duration = time.perf_counter() - started
            self._log_decision(
                decision, pending_gangs, len(snapshot.nodes), decided - decide_started, duration
            )
            if self._batch_ends(decision, count, started):
                break
            started = decide_started = time.perf_counter()
        turn.close()
        return first

    def _carry_out(self, decision: Decision, pods: Mapping[PodKey, PodRequest], now: float) -> None:
        """Apply one decision; a fault fails only its gang (it backs off, the cycle goes on)."""
        if decision.fault is not None:
            log.error("decision_failed", gang=decision.gang.key, error=decision.fault)
        try:
            self._apply(decision, pods, now)
        except Exception:  # one gang's fault: it backs off, the cycle goes on
            log.exception("apply_failed", gang=decision.gang.key)
            self.queue.failed(decision.gang.key, now)

    def _batch_ends(self, decision: Decision, count: int, started: float) -> bool:
        """Stop after a decision with victims (the room it holds changes what the next gangs
        may use), after ``batch_decisions``, or once ``batch_seconds`` have passed since
        ``started``."""
        return bool(
            decision.victims
            or count >= self.settings.batch_decisions
            or time.perf_counter() - started >= self.settings.batch_seconds
        )

    def _next_due(self, working: list[Gang]) -> float | None:
        """When an idle loop looks again: the earliest end of a backoff, an eviction or hold
        falling due, or a torn gang's release (``None``: only when woken)."""
        backoff_ends = self.queue.next_ready(g.key for g in working)
        times = [t for t in [backoff_ends, self._reclaim_due()] if t is not None]
        torn_due = self._torn.next_due()
        if torn_due is not None:
            times.append(torn_due)
        return min(times) if times else None

    def _log_decision(
        self, decision: Decision, pending_gangs: int, nodes: int, decide: float, duration: float
    ) -> None:
        if decision.min_count or (decision.bindings and decision.unschedulable is None):
            result = "scheduled"
        elif decision.victims:
            result = "reclaiming"
        elif decision.unschedulable:
            result = "unschedulable"
        else:
            result = "idle"
        self.metrics.cycle_seconds.labels(result).observe(duration)
        gang = decision.gang
        log.info(
            "cycle",
            cycle=self._cycle,
            gang=gang.key,
            result=result,
            min=gang.min_member,
            max=gang.max_member,
            bound=len(gang.bound),
            placed_min=decision.min_count,
            placed_surplus=len(decision.bindings) - decision.min_count,
            surplus_held=decision.surplus_held,
            victims=len(decision.victims),
            pending_gangs=pending_gangs,
            nodes=nodes,
            decide_ms=round(decide * 1000, 3),
            cycle_ms=round(duration * 1000, 3),
            reason=decision.unschedulable.message() if decision.unschedulable else None,
        )

    def _apply(self, decision: Decision, pods: Mapping[PodKey, PodRequest], now: float) -> None:
        gang = decision.gang
        if decision.victims:
            self._reclaim(decision, pods, now)
        self._stuck(decision, now)
        why = decision.unschedulable
        if why is not None:
            self.reporter.unschedulable(gang, gang.pending, why.message(), waiting=why.waiting)
        elif decision.surplus_unschedulable is not None:
            placed = {a.pod for a in decision.bindings}
            waiting = [p for p in gang.pending if p.key not in placed]
            message = (
                f"Surplus member of gang {gang.name} (minimum {gang.min_member} met): "
                f"{decision.surplus_unschedulable.message()}"
            )
            self.reporter.unschedulable(gang, waiting, message)
        if not decision.bindings:
            return
        with self._lock:
            self.reclaims.placed(gang.key)
        if decision.min_count and gang.min_missing > 0:
            self.metrics.gang_latency_seconds.observe(max(0.0, now - gang.created))
        self.cache.assume(decision.bindings, now)
        members = {p.key: p for p in gang.members}
        for assignment in decision.bindings:
            pod = members[assignment.pod]
            with self._lock:
                self.in_flight += 1
            future = self._binds.submit(self._bind, pod, assignment.node)
            future.add_done_callback(functools.partial(self._bound, gang, pod, assignment))

    def _bind(self, pod: PodRequest, node: NodeName) -> str | None:
        # The node was in the decision's snapshot; it may have been deleted since. The API
        # server would accept a binding to a node that does not exist.
        if not self.cache.has_node(node):
            return f"node {node} no longer exists"
        return self.binder.bind(pod, node)

    def _bound(
        self, gang: Gang, pod: PodRequest, a: Assignment, future: Future[str | None]
    ) -> None:
        with self._lock:
            self.in_flight -= 1
        try:
            error = future.result()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        if error is None:
            self.metrics.binds.labels("ok").inc()
            self.reporter.scheduled(gang, pod, a.node)
            return
        self.metrics.binds.labels("error").inc()
        self.cache.forget(a.pod)
        log.warning("bind_failed", pod=a.pod, node=a.node, gang=gang.key, error=error)
        self.reporter.bind_failed(pod, a.node, error)
        with self._lock:
            self._bind_failed.append((gang.key, self._clock()))
        # Not "freed": the room was only assumed, and ending every backoff on each failure
        # turns a throttling API server (429) into a retry storm.
        self.wake()

    # -- reclaim -----------------------------------------------------------------------------------
    def _reclaim(self, decision: Decision, pods: Mapping[PodKey, PodRequest], now: float) -> None:
        gang = decision.gang
        members = {p.key: p for p in gang.members}
        victims = [pods[key] for key in decision.victims if key in pods]
        with self._lock:
            leave_by = self.reclaims.chosen(
                gang.key,
                (p.key for p in victims),
                ((a.node, members[a.pod].requests) for a in decision.nominated),
                now,
            )
        for a in decision.nominated:
            self.reporter.nominated(members[a.pod], a.node)
        for pod in victims:
            self.metrics.reclaims.inc()
            log.info("reclaim", pod=pod.key, gang=gang.key, deadline=leave_by)
            self.reporter.asked_to_leave(pod, gang, leave_by)
            self._binds.submit(
                self._write, "ask_to_leave", self.binder.ask_to_leave, pod, leave_by, gang.key
            )

    def _track_victims(
        self, gangs: list[Gang], pods: Mapping[PodKey, PodRequest], now: float
    ) -> tuple[Mapping[GangKey, int], dict[GangKey, Room]]:
        """Bring the reclaim ledger up to ``now`` and evict the victims that are due; returns
        per gang how many of its victims are still there, and the room held per gang."""
        with self._lock:
            update = self.reclaims.update(gangs, pods, now)
            due = self.reclaims.due(pods, now)
            reserved = self.reclaims.reserved()
        for key in due:
            self._binds.submit(self._evict, pods[key])
        return update.leaving, reserved

    def _reclaim_due(self) -> float | None:
        """When an eviction falls due or a hold ends next (the idle loop wakes then)."""
        with self._lock:
            return self.reclaims.next_due()

    def _track_torn(self, gangs: list[Gang], now: float) -> None:
        """Tell users about stuck torn gangs (again when what they are told changes); release
        the ones stuck past the grace."""
        update = self._torn.update(gangs, now)
        for told in update.told:
            self._tell_torn(told)
        for due in update.due:
            self._release(due, now)

    def _tell_torn(self, torn: Torn) -> None:
        gang = torn.gang
        if torn.first:
            shortfall = torn.shortfall
            log.warning(
                "gang_torn",
                gang=gang.key,
                bound=shortfall.bound,
                min=gang.min_member,
                pending=shortfall.pending,
                release_at=torn.release_at,
            )
        self.reporter.torn(gang, torn.release_at)

    def _stuck(self, decision: Decision, now: float) -> None:
        """A torn gang whose members exist but found no room is stuck, unless room is on its
        way (victims chosen now, or asked to leave for it before)."""
        why = decision.unschedulable
        if why is None or why.waiting or decision.victims or decision.fault is not None:
            return
        with self._lock:
            if self.reclaims.leaving().get(decision.gang.key):
                return
        told = self._torn.stuck(decision.gang, now)
        if told is not None:
            self._tell_torn(told)

    def _release(self, torn: Torn, now: float) -> None:
        """Ask a torn gang's survivors to leave, as a reclaim does (``shoal.dev/leave-by``, the
        node agent tells their workers); the reclaim ledger evicts each at its leave-by unless
        it acknowledged first. Members already asked to leave (for any gang) are spent: they
        keep the leave-by they have."""
        gang = torn.gang
        alive = torn.survivors
        with self._lock:
            keys, leave_by = self.reclaims.ask(gang.key, (p.key for p in alive), (), now)
        fresh = set(keys)
        asked = [p for p in alive if p.key in fresh]
        if not asked:
            return
        log.warning(
            "torn_gang_released",
            gang=gang.key,
            bound=len(torn.survivors),
            min=gang.min_member,
            torn_seconds=round(now - torn.since, 1),
            deadline=leave_by,
        )
        self.metrics.torn_released.inc()
        self.reporter.released(gang, torn.since, leave_by)
        for pod in asked:
            self._binds.submit(
                self._write, "ask_to_leave", self.binder.ask_to_leave, pod, leave_by, gang.key
            )

    def _evict(self, pod: PodRequest) -> None:
        try:
            error = self.binder.evict(pod)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        # Only now may the loop evict this pod again (a victim: a little later, on failure).
        if error is not None:
            log.warning("evict_failed", pod=pod.key, error=error)
            with self._lock:
                self.reclaims.eviction_failed(pod.key, self._clock())
        else:
            log.info("evicted", pod=pod.key)
            with self._lock:
                self.reclaims.evicted(pod.key)
        self.wake()

    def _write(self, action: str, fn: Callable[..., str | None], *args: object) -> None:
        try:
            error = fn(*args)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        if error is not None:
            log.warning("write_failed", action=action, error=error)

    def _report_invalid(self, invalid: list[InvalidGang]) -> None:
        self.metrics.invalid_gangs.set(len(invalid))
        if len(self._invalid_seen) > 10_000:
            self._invalid_seen.clear()  # bounded; at worst one repeated log line per gang
        for bad in invalid:
            if self._invalid_seen.get(bad.key) != bad.message:
                self._invalid_seen[bad.key] = bad.message
                log.warning("invalid_gang", gang=bad.key, reason=bad.message)
            self.reporter.invalid(bad)


def _groups_with_pods(snapshot: Snapshot) -> Iterator[tuple[PodGroup, Sequence[PodRequest]]]:
    """Each PodGroup with the pods filed under its gang key (those that name it, and any other
    pod whose gang shares the key; :class:`GroupStatuses` keeps only the ones that name it)."""
    members = snapshot.members
    groups = [(r, g) for r, g in snapshot.pod_groups.items() if g.api is SP]
    if members is None:
        every = tuple(snapshot.pods.values())
        for _, group in groups:
            yield group, every
        return
    for ref, group in groups:
        yield group, members.get(GangKey(ref), ())
