"""Leader election on a ``coordination.k8s.io`` Lease, with the official client's elector, and
the fence that every write of the leader passes.

Two replicas run; one holds the Lease and schedules, the other is a ready standby that keeps its
caches warm. A leader that cannot renew stops scheduling at once and asks its process to exit
(as kube-scheduler does): a fresh start is the only safe way back, since another replica may
already have bound pods it does not know about yet.

The fence. The elector's "leading" lasts until its renew deadline runs out, counted from when
its renewal loop next wakes; a process that was paused (a stop signal, a long garbage
collection, a frozen VM) wakes up still "leading" while another replica has held the Lease for a
while. So a leader trusts the Lease only by its own clock: it holds it for ``renew_deadline``
seconds from the moment it sent its last successful acquire or renew (taken before the request
left, so never later than the API server saw it). A standby takes the Lease no sooner than
``lease_duration`` after it saw that renewal, which came after; the difference, lease duration
less renew deadline, is the margin left for clocks that run at slightly different rates. The
clock counts the time the process was stopped, so a paused leader finds its fence closed the
moment it wakes and writes nothing: :meth:`LeaderElector.refusal` is asked at the start of each
cycle and right before each bind, status write, Event and eviction leaves (``FencedApi`` in
``scheduler/k8s/client.py``). It opens again only with a renewal, which fails if another
replica has taken the Lease; the elector then gives up and the process exits.

A leader that stops (SIGTERM: its pod deleted, a rollout) gives the Lease back on its way out
(:func:`release_lease`), so the standby leads within a retry period instead of waiting out the
lease duration; the elector's thread acquires and renews nothing after that.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import structlog
from kubernetes import client
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

log = structlog.get_logger("scheduler.lease")


def _boot_clock() -> float:
    """Seconds on a clock that never goes back and counts every pause of the process, and on
    Linux a suspend of the machine too (``CLOCK_BOOTTIME``; ``time.monotonic`` elsewhere)."""
    if hasattr(time, "CLOCK_BOOTTIME"):
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.monotonic()


def holds_lease(renewed_at: float | None, lease_duration: float, margin: float, now: float) -> bool:
    """Whether a replica that sent its last successful acquire or renew at ``renewed_at`` (on its
    own clock; ``None``: never) still holds the Lease at ``now``: until ``margin`` seconds before
    the lease duration from then runs out. Pure."""
    return renewed_at is not None and renewed_at + lease_duration - margin > now


class LeaseFence:
    """When this replica last sent a successful acquire or renew, and whether it may write now.
    Thread-safe enough: one writer (the elector's thread) sets a float, any thread reads it."""

    def __init__(
        self, lease_duration: float, renew_deadline: float, clock: Callable[[], float]
    ) -> None:
        self.lease_duration = float(lease_duration)
        self.margin = float(lease_duration) - float(renew_deadline)
        self._clock = clock
        #: The clock when the last successful acquire or renew was sent; ``None``: never.
        self._renewed_at: float | None = None
        #: Whether the closed fence has been logged since the last renewal.
        self._logged = False

    def renewed(self, sent: float) -> None:
        """An acquire or renew sent at ``sent`` succeeded."""
        if self._logged:
            log.info("lease_renewed_writes_resume")
        self._renewed_at = sent
        self._logged = False

    def refusal(self) -> str | None:
        """Why the Lease is not held by this clock now, or ``None`` when it is."""
        renewed_at = self._renewed_at
        now = self._clock()
        if holds_lease(renewed_at, self.lease_duration, self.margin, now):
            return None
        ago = "never" if renewed_at is None else f"{now - renewed_at:.1f} s ago"
        why = (
            f"the Lease was last renewed {ago}, and is trusted for "
            f"{self.lease_duration - self.margin:g} s"
        )
        if not self._logged:
            self._logged = True
            log.warning("lease_not_held_writes_stopped", reason=why)
        return why


def release_lease(leases: Any, name: str, namespace: str, identity: str) -> bool:
    """Give the Lease ``name`` back if ``identity`` holds it, as client-go's elector does when
    it stops (no holder, a one-second duration, renewed now): a standby takes it at its next
    try. Returns whether it was given back; a failure is logged, never raised (the Lease then
    runs out on its own)."""
    try:
        lease = leases.read_namespaced_lease(name, namespace)
        if lease.spec is None or lease.spec.holder_identity != identity:
            return False
        now = datetime.now(UTC)
        lease.spec.holder_identity = None
        lease.spec.lease_duration_seconds = 1
        lease.spec.acquire_time = now
        lease.spec.renew_time = now
        leases.replace_namespaced_lease(name, namespace, lease)  # refused if it changed since
    except Exception as exc:
        log.warning("lease_not_released", identity=identity, error=str(exc) or type(exc).__name__)
        return False
    log.info("lease_released", identity=identity)
    return True


class TimedLeaseLock:
    """The client's ``LeaseLock``, telling the fence when each create or update that made this
    candidate the holder was sent (the clock read before the request left: never later than
    the API server saw it)."""

    def __init__(self, lock: Any, clock: Callable[[], float], fence: LeaseFence) -> None:
        self._lock = lock
        self._clock = clock
        self._fence = fence
        self.name: str = lock.name
        self.namespace: str = lock.namespace
        self.identity: str = lock.identity
        #: Set when the replica stops: the elector's thread acquires and renews no more.
        self.closed = False

    def get(self, name: str, namespace: str) -> Any:
        return self._lock.get(name, namespace)

    def create(self, name: str, namespace: str, election_record: Any) -> bool:
        if self.closed:
            return False
        sent = self._clock()
        done = bool(self._lock.create(name, namespace, election_record))
        self._held(done, election_record, sent)
        return done

    def update(self, name: str, namespace: str, updated_record: Any) -> bool:
        if self.closed:
            return False
        sent = self._clock()
        done = bool(self._lock.update(name, namespace, updated_record))
        self._held(done, updated_record, sent)
        return done

    def _held(self, done: bool, record: Any, sent: float) -> None:
        if done and getattr(record, "holder_identity", None) == self.identity:
            self._fence.renewed(sent)


class LeaderElector:
    """Runs for the Lease on a thread; says whether this replica leads and may write now."""

    def __init__(
        self,
        api: Any,
        *,
        namespace: str,
        name: str,
        on_change: Callable[[bool], None],
        lease_duration: int = 15,
        renew_deadline: float = 10,
        retry_period: float = 2,
        clock: Callable[[], float] = _boot_clock,
    ) -> None:
        self.identity = f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
        lock = LeaseLock(name, namespace, self.identity)
        lock.api_instance = client.CoordinationV1Api(api)
        self._leases = lock.api_instance
        self.fence = LeaseFence(lease_duration, renew_deadline, clock)
        self._leading = threading.Event()
        self._stopping = threading.Event()
        self._on_change = on_change
        self._lock = TimedLeaseLock(lock, clock, self.fence)
        self._config = electionconfig.Config(
            self._lock,
            lease_duration,
            renew_deadline,
            retry_period,
            self._started,
            self._stopped,
        )
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)

    @property
    def leading(self) -> bool:
        """The elector's own view: it took the Lease and has not given up renewing it."""
        return self._leading.is_set()

    def is_leader(self) -> bool:
        """Leading, and holding the Lease by this process's clock right now."""
        return self.refusal() is None

    def refusal(self) -> str | None:
        """Why this replica may not write now (it does not lead, or cannot be sure it still
        holds the Lease), or ``None`` when it may. Thread-safe; asked before every write."""
        if not self._leading.is_set():
            return "this replica does not lead"
        return self.fence.refusal()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop leading for good; a leader gives the Lease back (as kube-scheduler does on its
        way out), so that the standby takes over within a retry period rather than once the
        lease duration has run out."""
        self._stopping.set()
        was = self._leading.is_set()
        self._leading.clear()
        self._lock.closed = True
        if was:
            release_lease(self._leases, self._lock.name, self._lock.namespace, self.identity)

    def _run(self) -> None:
        try:
            leaderelection.LeaderElection(self._config).run()
        except Exception:
            log.exception("leader_election_crashed", identity=self.identity)
            self._stopped()

    def _started(self) -> None:
        log.info("leader_elected", identity=self.identity)
        self._leading.set()
        self._on_change(True)

    def _stopped(self) -> None:
        was = self._leading.is_set()
        self._leading.clear()
        self._on_change(False)
        if was and not self._stopping.is_set():
            log.error("leadership_lost_exiting", identity=self.identity)
            os.kill(os.getpid(), signal.SIGTERM)
