"""The scheduling loop: snapshot, run the step, assume, bind concurrently, report.

This module wires the pure core to the outside through two protocols — a :class:`Binder` and a
:class:`Reporter` — so it imports no client library. What a cycle decides is
:func:`scheduler.step.step`, the one the simulator runs too (its state, :class:`Ledgers`, is
touched on the loop's thread only); the runner reads the cache, builds the gangs, carries out
the step's effects (bindings, leave-by notices, evictions, what users are told) on a worker
pool, hands what the workers learned back to the ledgers at the next cycle, and ends a batch
early when its time budget is spent. Informers feed the cache and call :meth:`Runner.wake`; the
loop sleeps when no gang is ready and wakes on the next event or when the step next has
something due.

Every failure path undoes its reservation: a binding that fails is forgotten in the cache (the
pod is charged to no node), and the gang is retried in a later cycle for what it still lacks.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from scheduler.cache import Cache
from scheduler.cache.cache import Snapshot
from scheduler.cycle import Config, Decision, has_work
from scheduler.gang import GangBuilder
from scheduler.gang.group_status import GroupStatus, GroupStatuses
from scheduler.gang.kinds import KINDS
from scheduler.metrics import Metrics
from scheduler.model import (
    Gang,
    GangKey,
    InvalidGang,
    NodeName,
    PodGroup,
    PodKey,
    PodRequest,
)
from scheduler.queue import GangQueue
from scheduler.reclaim_ledger import ReclaimLedger
from scheduler.step import Ledgers, Opening, Outcome, Release, StepSettings, step
from scheduler.torn import Torn

log = structlog.get_logger("scheduler")


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

    def asked_to_leave(self, pod: PodRequest, gang: Gang, leave_by: float, why: str = "") -> None:
        """``pod`` is asked to leave by ``leave_by`` for ``gang``; ``why`` it was chosen."""

    def nominated(self, pod: PodRequest, node: NodeName) -> None:
        """Room on ``node`` is held for ``pod`` (``status.nominatedNodeName``)."""

    def invalid(self, gang: InvalidGang) -> None: ...

    def group_status(self, group: PodGroup, status: GroupStatus) -> None:
        """The PodGroup ``group``, of a kind whose status comes from its members
        (scheduler-plugins'), should have ``status`` (called on every cycle; send what
        changed)."""

    def gang_status(self, gang: Gang) -> None:
        """``gang``'s PodGroup should show it, as its kind writes it (called on every cycle for
        each gang with a PodGroup; send what changed)."""

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
    #: The longest a surplus member of a node with an early warning waits for its checkpoint.
    early_warning_wait: float = 600.0
    #: Reclaim patience per PriorityClass name (``--reclaim-patience``).
    class_patience: Mapping[str, float] = field(default_factory=dict)

    def step(self) -> StepSettings:
        """What the step (:mod:`scheduler.step`) decides with."""
        return StepSettings(
            config=self.config,
            initial_backoff=self.initial_backoff,
            max_backoff=self.max_backoff,
            batch_decisions=self.batch_decisions,
            reclaim_grace=self.reclaim_grace,
            hold_extra=self.hold_extra,
            torn_grace=self.torn_grace,
            early_warning_wait=self.early_warning_wait,
            class_patience=self.class_patience,
        )


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
        #: The step's state (backoffs, victims and held room, torn gangs): read and written on
        #: the loop's thread only; worker threads leave their news in ``_news``.
        self.ledgers = Ledgers(settings.step())
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
        self._statuses = GroupStatuses(settings.scheduler_name)
        self._invalid_seen: dict[str, str] = {}
        self._gangs = GangBuilder(settings.scheduler_name)
        self.in_flight = 0
        self._lock = threading.Lock()
        # What worker threads learned since the last cycle, handed to the ledgers at its start
        # (under the lock): gangs whose binding failed (they back off like a gang that did not
        # fit, so a throttled or failing API server is not hammered with immediate retries),
        # evictions that were accepted, evictions that failed.
        self._bind_failed: list[tuple[GangKey, float]] = []
        self._evicted: list[PodKey] = []
        self._eviction_failed: list[tuple[PodKey, float]] = []

    @property
    def queue(self) -> GangQueue:
        return self.ledgers.queue

    @property
    def reclaims(self) -> ReclaimLedger:
        return self.ledgers.reclaims

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
        time the step next has something to do (a backoff ends, an eviction, hold or release
        falls due)."""
        started = time.perf_counter()
        now = self._clock()
        self._take_news(now)
        snapshot = self.cache.snapshot()
        gangs = self._read_gangs(snapshot, now)
        working = self._publish_state(gangs, snapshot, now)
        this = step(self.ledgers, gangs, snapshot, now)
        self._open(this.opening, now)
        first = self._carry_out_batch(this.outcomes, snapshot, now, started, len(working))
        if first is None:
            return None, self.ledgers.next_due(g.key for g in working)
        return first, None

    def _take_news(self, now: float) -> None:
        """What happened since the last cycle: room freed (every backoff ends), bindings that
        failed (their gangs back off), evictions done or failed, assumed bindings never
        confirmed (forgotten)."""
        if self._freed.is_set():
            self._freed.clear()
            self.ledgers.freed()
        with self._lock:
            failed, self._bind_failed = self._bind_failed, []
            evicted, self._evicted = self._evicted, []
            refused, self._eviction_failed = self._eviction_failed, []
        for gang_key, when in dict(failed).items():
            self.ledgers.bind_failed(gang_key, when)
        for key in evicted:
            self.ledgers.evicted(key)
        for key, when in refused:
            self.ledgers.eviction_failed(key, when)
        for key in self.cache.expire(now):
            log.warning("assume_expired", pod=key)

    def _read_gangs(self, snapshot: Snapshot, now: float) -> list[Gang]:
        """The snapshot's gangs; invalid ones are reported (gangs gone leave the queue in the
        step)."""
        gangs, invalid = self._gangs.build(
            snapshot.pods.values(), snapshot.pod_groups, snapshot.members
        )
        if self._observe is not None:
            self._observe(snapshot, gangs, invalid, now)
        self._report_invalid(invalid)
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
            if gang.pod_group is not None:
                self.reporter.gang_status(gang)
        working = [g for g in gangs if has_work(g)]
        self.metrics.pending_gangs.set(len(working))
        return working

    def _open(self, opening: Opening, now: float) -> None:
        """Carry out what the step does before its decisions: evictions due, torn gangs told
        and released."""
        for pod in opening.evict:
            self._binds.submit(self._evict, pod)
        for told in opening.told:
            self._tell_torn(told)
        for release in opening.released:
            self._release(release, now)
        for shrink in opening.shrunk:
            self._ask(shrink.gang, shrink.asked, shrink.leave_by)
        for ask in opening.asks:
            self._ask(ask.gang, ask.asked, ask.leave_by, ask.why)
            for pod in ask.waiting:
                log.info("reclaim_waits_for_checkpoint", pod=pod.key, gang=ask.gang.key)

    def _carry_out_batch(
        self,
        outcomes: Generator[Outcome],
        snapshot: Snapshot,
        now: float,
        started: float,
        pending_gangs: int,
    ) -> Decision | None:
        """Carry out the step's decisions as they come, until the step ends its batch or
        ``batch_seconds`` have passed; returns the first decision (``None``: none was ready)."""
        decide_started = time.perf_counter()
        first: Decision | None = None
        try:
            for outcome in outcomes:
                decided = time.perf_counter()
                decision = outcome.decision
                first = first or decision
                self._cycle += 1
                self.metrics.decision_seconds.observe(decided - decide_started)
                self._carry_out(outcome, now)
                duration = time.perf_counter() - started
                self._log_decision(
                    decision,
                    pending_gangs,
                    len(snapshot.nodes),
                    decided - decide_started,
                    duration,
                )
                if time.perf_counter() - started >= self.settings.batch_seconds:
                    break
                started = decide_started = time.perf_counter()
        finally:
            outcomes.close()
        return first

    def _carry_out(self, outcome: Outcome, now: float) -> None:
        """Carry out one decision; a fault fails only its gang (it backs off, the cycle goes
        on)."""
        decision = outcome.decision
        if decision.fault is not None:
            log.error("decision_failed", gang=decision.gang.key, error=decision.fault)
        try:
            self._apply(outcome, now)
        except Exception:  # one gang's fault: it backs off, the cycle goes on
            log.exception("apply_failed", gang=decision.gang.key)
            self.ledgers.bind_failed(decision.gang.key, now)

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

    def _apply(self, outcome: Outcome, now: float) -> None:
        decision = outcome.decision
        gang = decision.gang
        self._reclaim(outcome)
        if outcome.told is not None:
            self._tell_torn(outcome.told)
        unplaced = outcome.unplaced
        if unplaced is not None:
            self.reporter.unschedulable(
                gang, unplaced.pods, unplaced.message, waiting=unplaced.waiting
            )
        if not outcome.binds:
            return
        if decision.min_count and gang.min_missing > 0:
            self.metrics.gang_latency_seconds.observe(max(0.0, now - gang.created))
        self.cache.assume(decision.bindings, now)
        for pod, node in outcome.binds:
            with self._lock:
                self.in_flight += 1
            future = self._binds.submit(self._bind, pod, node)
            future.add_done_callback(functools.partial(self._bound, gang, pod, node))

    def _bind(self, pod: PodRequest, node: NodeName) -> str | None:
        # The node was in the decision's snapshot; it may have been deleted since. The API
        # server would accept a binding to a node that does not exist.
        if not self.cache.has_node(node):
            return f"node {node} no longer exists"
        return self.binder.bind(pod, node)

    def _bound(
        self, gang: Gang, pod: PodRequest, node: NodeName, future: Future[str | None]
    ) -> None:
        with self._lock:
            self.in_flight -= 1
        try:
            error = future.result()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        if error is None:
            self.metrics.binds.labels("ok").inc()
            self.reporter.scheduled(gang, pod, node)
            return
        self.metrics.binds.labels("error").inc()
        self.cache.forget(pod.key)
        log.warning("bind_failed", pod=pod.key, node=node, gang=gang.key, error=error)
        self.reporter.bind_failed(pod, node, error)
        with self._lock:
            self._bind_failed.append((gang.key, self._clock()))
        # Not "freed": the room was only assumed, and ending every backoff on each failure
        # turns a throttling API server (429) into a retry storm.
        self.wake()

    # -- reclaim -----------------------------------------------------------------------------------
    def _reclaim(self, outcome: Outcome) -> None:
        """Hold room for the gang (``nominatedNodeName``) and ask the victims asked now to
        leave by their leave-by."""
        gang = outcome.decision.gang
        for pod, node in outcome.nominated:
            self.reporter.nominated(pod, node)
        if outcome.leave_by is not None:
            self._ask(gang, outcome.asked, outcome.leave_by, outcome.why)
        for pod in outcome.waiting:
            log.info("reclaim_waits_for_checkpoint", pod=pod.key, gang=gang.key)

    def _ask(
        self,
        gang: Gang,
        asked: Sequence[PodRequest],
        leave_by: float,
        why: Mapping[PodKey, str] | None = None,
    ) -> None:
        """Ask ``asked`` to leave by ``leave_by`` for ``gang`` (the room they free is its, or
        they are its own members above its maximum, or on a node expected to go)."""
        why = why or {}
        for pod in asked:
            self.metrics.reclaims.inc()
            log.info("reclaim", pod=pod.key, gang=gang.key, deadline=leave_by)
            self.reporter.asked_to_leave(pod, gang, leave_by, why.get(pod.key, ""))
            self._binds.submit(
                self._write, "ask_to_leave", self.binder.ask_to_leave, pod, leave_by, gang.key
            )

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

    def _release(self, release: Release, now: float) -> None:
        """Ask a torn gang's survivors to leave, as a reclaim does (``shoal.dev/leave-by``, the
        node agent tells their workers); the reclaim ledger evicts each at its leave-by unless
        it acknowledged first. Members already asked to leave (for any gang) are spent: the
        step leaves them out, they keep the leave-by they have."""
        torn = release.torn
        gang = torn.gang
        if not release.asked:
            return
        log.warning(
            "torn_gang_released",
            gang=gang.key,
            bound=len(torn.survivors),
            min=gang.min_member,
            torn_seconds=round(now - torn.since, 1),
            deadline=release.leave_by,
        )
        self.metrics.torn_released.inc()
        self.reporter.released(gang, torn.since, release.leave_by)
        for pod in release.asked:
            self._binds.submit(
                self._write,
                "ask_to_leave",
                self.binder.ask_to_leave,
                pod,
                release.leave_by,
                gang.key,
            )

    def _evict(self, pod: PodRequest) -> None:
        try:
            error = self.binder.evict(pod)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        # Only now may the loop evict this pod again (a victim: a little later, on failure);
        # the ledgers hear of it at the start of the next cycle.
        if error is not None:
            log.warning("evict_failed", pod=pod.key, error=error)
            with self._lock:
                self._eviction_failed.append((pod.key, self._clock()))
        else:
            log.info("evicted", pod=pod.key)
            with self._lock:
                self._evicted.append(pod.key)
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
    groups = [(r, g) for r, g in snapshot.pod_groups.items() if KINDS.of(g).status_from_members]
    if members is None:
        every = tuple(snapshot.pods.values())
        for _, group in groups:
            yield group, every
        return
    for ref, group in groups:
        yield group, members.get(GangKey(ref), ())
