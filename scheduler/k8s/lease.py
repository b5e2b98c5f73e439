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
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
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

    def get(self, name: str, namespace: str) -> Any:
        return self._lock.get(name, namespace)

    def create(self, name: str, namespace: str, election_record: Any) -> bool:
        sent = self._clock()
        done = bool(self._lock.create(name, namespace, election_record))
        self._held(done, election_record, sent)
        return done

    def update(self, name: str, namespace: str, updated_record: Any) -> bool:
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
        self.fence = LeaseFence(lease_duration, renew_deadline, clock)
        self._leading = threading.Event()
        self._stopping = threading.Event()
        self._on_change = on_change
        self._config = electionconfig.Config(
            TimedLeaseLock(lock, clock, self.fence),
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
        self._stopping.set()
        self._leading.clear()

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
