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
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

import structlog

from contracts import names
from scheduler.cache import Cache
from scheduler.cycle import Config, Decision, decide_in_turn, has_work
from scheduler.gang import GangBuilder
from scheduler.metrics import Metrics
from scheduler.model import (
    Assignment,
    Gang,
    GangKey,
    InvalidGang,
    NodeName,
    PodKey,
    PodRequest,
    Resources,
)
from scheduler.queue import GangQueue

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

    def unschedulable(self, gang: Gang, pods: Sequence[PodRequest], message: str) -> None:
        """``pods`` of ``gang`` could not be placed, for the reason ``message``."""

    def scheduled(self, gang: Gang, pod: PodRequest, node: NodeName) -> None: ...

    def bind_failed(self, pod: PodRequest, node: NodeName, error: str) -> None: ...

    def asked_to_leave(self, pod: PodRequest, gang: Gang, leave_by: float) -> None: ...

    def nominated(self, pod: PodRequest, node: NodeName) -> None:
        """Room on ``node`` is held for ``pod`` (``status.nominatedNodeName``)."""

    def invalid(self, gang: InvalidGang) -> None: ...

    def gang_status(self, gang: Gang) -> None: ...


@dataclass(frozen=True, slots=True)
class Settings:
    scheduler_name: str
    bind_workers: int = 16
    config: Config = field(default_factory=Config)
    initial_backoff: float = 1.0
    max_backoff: float = 10.0
    #: How often every gang's status (scheduled / running counts) is refreshed.
    status_interval: float = 2.0
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
        self._wakeup = threading.Event()
        self._freed = threading.Event()
        self._binds = executor or ThreadPoolExecutor(
            max_workers=max(1, settings.bind_workers), thread_name_prefix="bind"
        )
        self._cycle = 0
        self._last_status = 0.0
        self._invalid_seen: dict[str, str] = {}
        self._gangs = GangBuilder(settings.scheduler_name)
        # Reclaim state: victim -> (the gang it makes room for, when to evict it), the pods
        # being evicted now, and the room held per gang (until it binds or the hold expires).
        self._victims: dict[PodKey, tuple[GangKey, float]] = {}
        self._evicting: set[PodKey] = set()
        self._held: dict[GangKey, tuple[tuple[tuple[NodeName, Resources], ...], float]] = {}
        self.in_flight = 0
        self._lock = threading.Lock()
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
            if decision is None:
                wait = self.settings.idle_wait
                if next_at is not None:
                    wait = max(0.01, min(wait, next_at - self._clock()))
                self._wakeup.wait(wait)

    def close(self) -> None:
        self._binds.shutdown(wait=True)

    # -- one cycle ---------------------------------------------------------------------------------
    def run_once(self) -> tuple[Decision | None, float | None]:
        """One cycle; returns its decision (``None`` if no gang was ready) and, when idle, the
        time the earliest backoff ends."""
        started = time.perf_counter()
        now = self._clock()
        if self._freed.is_set():
            self._freed.clear()
            self.queue.wake()
        with self._lock:
            failed, self._bind_failed = self._bind_failed, []
        for gang_key, when in dict(failed).items():
            self.queue.failed(gang_key, when)
        for key in self.cache.expire(now):
            log.warning("assume_expired", pod=key)
        snapshot = self.cache.snapshot()
        gangs, invalid = self._gangs.build(
            snapshot.pods.values(), snapshot.pod_groups, snapshot.members
        )
        self._report_invalid(invalid)
        self.queue.prune(g.key for g in gangs)
        self.metrics.queue_entries.set(len(self.queue))
        self.metrics.cached_pods.set(len(snapshot.pods))
        self.metrics.binds_in_flight.set(self.in_flight)
        if now - self._last_status >= self.settings.status_interval:
            self._last_status = now
            for gang in gangs:
                self.reporter.gang_status(gang)
        working = [g for g in gangs if has_work(g)]
        self.metrics.pending_gangs.set(len(working))
        leaving = self._track_victims(gangs, snapshot.pods, now)

        decide_started = time.perf_counter()
        turn = decide_in_turn(
            gangs,
            self.queue,
            snapshot,
            now,
            self.settings.config,
            reserved={k: held for k, (held, _) in self._held.items()},
            leaving=leaving,
        )
        first: Decision | None = None
        for count, decision in enumerate(turn, start=1):
            decided = time.perf_counter()
            first = first or decision
            self._cycle += 1
            self.metrics.decision_seconds.observe(decided - decide_started)
            self._apply(decision, snapshot.pods, now)
            duration = time.perf_counter() - started
            self._log_decision(
                decision, len(working), len(snapshot.nodes), decided - decide_started, duration
            )
            if (
                decision.victims
                or count >= self.settings.batch_decisions
                or time.perf_counter() - started >= self.settings.batch_seconds
            ):
                break
            started = decide_started = time.perf_counter()
        turn.close()
        if first is None:
            times = [t for t in [self.queue.next_ready(g.key for g in working)] if t is not None]
            times.extend(deadline for _, deadline in self._victims.values())
            return None, min(times) if times else None
        return first, None

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
        if decision.unschedulable is not None:
            self.reporter.unschedulable(gang, gang.pending, decision.unschedulable.message())
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
        self._held.pop(gang.key, None)
        if decision.min_count and gang.min_missing > 0:
            self.metrics.gang_latency_seconds.observe(max(0.0, now - gang.created))
        self.cache.assume(decision.bindings, now)
        members = {p.key: p for p in gang.members}
        for assignment in decision.bindings:
            pod = members[assignment.pod]
            with self._lock:
                self.in_flight += 1
            future = self._binds.submit(self.binder.bind, pod, assignment.node)
            future.add_done_callback(functools.partial(self._bound, gang, pod, assignment))

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
        leave_by = now + self.settings.reclaim_grace
        members = {p.key: p for p in gang.members}
        self._held[gang.key] = (
            tuple((a.node, members[a.pod].requests) for a in decision.nominated),
            leave_by + self.settings.hold_extra,
        )
        for a in decision.nominated:
            self.reporter.nominated(members[a.pod], a.node)
        for key in decision.victims:
            pod = pods.get(key)
            if pod is None:
                continue
            self._victims[key] = (gang.key, leave_by)
            self.metrics.reclaims.inc()
            log.info("reclaim", pod=key, gang=gang.key, deadline=leave_by)
            self.reporter.asked_to_leave(pod, gang, leave_by)
            self._binds.submit(
                self._write, "ask_to_leave", self.binder.ask_to_leave, pod, leave_by, gang.key
            )

    def _track_victims(
        self, gangs: list[Gang], pods: Mapping[PodKey, PodRequest], now: float
    ) -> dict[GangKey, int]:
        """Forget victims that left, pick up ones a previous run chose, evict the due ones;
        returns per gang how many of its victims are still there."""
        for gang in gangs:
            for member in gang.bound:
                target = member.annotations.get(names.RECLAIMED_FOR_ANNOTATION)
                if target and member.key not in self._victims:
                    notice = member.annotations.get(names.LEAVE_BY_ANNOTATION)
                    self._victims[member.key] = (GangKey(target), _parse_time(notice, now))
        leaving: dict[GangKey, int] = {}
        for key, (gang_key, deadline) in list(self._victims.items()):
            pod = pods.get(key)
            if pod is None or pod.node is None or pod.finished:
                del self._victims[key]
                continue
            leaving[gang_key] = leaving.get(gang_key, 0) + 1
            if deadline <= now and key not in self._evicting and not pod.deleting:
                self._evicting.add(key)
                self._binds.submit(self._evict, pod)
        alive = {g.key: g for g in gangs}
        for held_for, (_, until) in list(self._held.items()):
            waiting = alive.get(held_for)
            if waiting is None or waiting.min_missing == 0 or until <= now:
                del self._held[held_for]
        return leaving

    def _evict(self, pod: PodRequest) -> None:
        try:
            error = self.binder.evict(pod)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        if error is not None:
            log.warning("evict_failed", pod=pod.key, error=error)
            entry = self._victims.get(pod.key)
            if entry is not None:  # retry a little later (a PodDisruptionBudget, a conflict)
                self._victims[pod.key] = (entry[0], self._clock() + 5.0)
        else:
            log.info("evicted", pod=pod.key)
        # Only now may the loop evict this pod again (after the new deadline, on failure).
        self._evicting.discard(pod.key)
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


def _parse_time(text: str | None, default: float) -> float:
    if not text:
        return default
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default
