"""Leader election on a ``coordination.k8s.io`` Lease, with the official client's elector.

Two replicas run; one holds the Lease and schedules, the other is a ready standby that keeps its
caches warm. A leader that cannot renew stops scheduling at once and asks its process to exit
(as kube-scheduler does): a fresh start is the only safe way back, since another replica may
already have bound pods it does not know about yet.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import uuid
from collections.abc import Callable
from typing import Any

import structlog
from kubernetes import client
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

log = structlog.get_logger("scheduler.lease")


class LeaderElector:
    def __init__(
        self,
        api: Any,
        *,
        namespace: str,
        name: str,
        on_change: Callable[[bool], None],
        lease_duration: int = 15,
        renew_deadline: int = 10,
        retry_period: int = 2,
    ) -> None:
        self.identity = f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
        lock = LeaseLock(name, namespace, self.identity)
        lock.api_instance = client.CoordinationV1Api(api)
        self._leading = threading.Event()
        self._stopping = threading.Event()
        self._on_change = on_change
        self._config = electionconfig.Config(
            lock, lease_duration, renew_deadline, retry_period, self._started, self._stopped
        )
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)

    def is_leader(self) -> bool:
        return self._leading.is_set()

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
