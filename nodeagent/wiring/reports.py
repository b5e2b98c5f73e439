"""What the HTTP endpoints say (:mod:`nodeagent.wiring.health`): the ``/healthz``, ``/readyz`` and
``/status`` documents. Read-only views of the other rooms; nothing here changes state.

- ``/healthz`` (liveness): the event loop turns (it answers), every background task runs and
  the reconcile loop turned in the last :data:`STALL_AFTER` seconds. Never whether the API
  server answers: the reconcile loop does not wait on it, and a restarted agent would be no
  better off.
- ``/readyz``: each metadata channel read recently, the API server answered in the last
  :data:`STALL_AFTER` seconds, and the state restored. The GPUs are reported, never a reason to
  be unready (a lost GPU must not stop revocation notices).
- ``/status``: the live notices, the pods and what they were told, channels, GPUs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from nodeagent.adapters.metrics import Metrics
from nodeagent.core.events import Tracked, rfc3339
from nodeagent.core.ports import ClusterPort, GpuView
from nodeagent.core.store import Store
from nodeagent.wiring.board import NoticeBoard
from nodeagent.wiring.channels import Channels
from nodeagent.wiring.executor import Executor
from nodeagent.wiring.guard import Guard
from nodeagent.wiring.pods import PodList
from nodeagent.wiring.reconcile import Reconciler

#: Seconds without a reconcile turn (``/healthz``) or an API answer (``/readyz``) that count.
STALL_AFTER = 30.0

Document = tuple[bool, dict[str, Any]]


def _notice(tracked: Tracked) -> dict[str, Any]:
    notice = tracked.notice
    return {
        "event_id": notice.event_id,
        "source": notice.source,
        "channel": notice.channel,
        "kind": notice.kind.value,
        "deadline": rfc3339(notice.deadline),
        "disruptive": notice.disruptive,
        "reason": notice.reason,
        "scope": sorted(notice.scope) if notice.scope is not None else "node",
        "first_seen": rfc3339(tracked.first_seen),
        "upstream_acked": tracked.upstream_acked,
    }


class Reports:
    """Satisfies :class:`nodeagent.wiring.health.Endpoints`."""

    def __init__(
        self,
        *,
        node_name: str,
        providers: Sequence[str],
        cluster: ClusterPort,
        store: Store,
        channels: Channels,
        pods: PodList,
        board: NoticeBoard,
        executor: Executor,
        reconciler: Reconciler,
        guard: Guard,
        gpu: GpuView | None,
        metrics: Metrics,
    ) -> None:
        self._node_name = node_name
        self._providers = tuple(providers)
        self._cluster = cluster
        self._store = store
        self._channels = channels
        self._pods = pods
        self._board = board
        self._executor = executor
        self._reconciler = reconciler
        self._guard = guard
        self._gpu = gpu
        self.metrics = metrics

    def watchers(self) -> int:
        return self._board.watchers()

    def _api_age(self, now: float) -> float | None:
        last_ok = self._cluster.last_ok
        return None if not last_ok else now - last_ok

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        api_age = self._api_age(now)
        return {
            "node": self._node_name,
            "providers": list(self._providers),
            "dry_run": self._cluster.dry_run,
            "restored": self._pods.restored,
            "reconciles": self._reconciler.turns,
            "notices": [_notice(t) for t in self._store.active()],
            "pods": self._store.pod_report(),
            "watchers": self._board.watchers(),
            "channels": self._channels.report(now),
            "api_seconds_since_ok": None if api_age is None else round(api_age, 3),
            "gpu": self._gpu.report() if self._gpu is not None else {"state": "disabled"},
            "task_crashes": self._guard.crashes,
        }

    def live(self) -> Document:
        dead = self._guard.dead()
        age = time.monotonic() - self._reconciler.heartbeat
        return not dead and age < STALL_AFTER, {
            "tasks_dead": dead,
            "reconcile_seconds_ago": round(age, 3),
            "api_writes_pending": self._executor.pending,
        }

    def ready(self) -> Document:
        now = time.monotonic()
        metadata = self._channels.readiness(self._providers, now)
        api_age = self._api_age(now)
        api_ok = api_age is not None and api_age < STALL_AFTER
        restored = self._pods.restored
        ok = all(v in ("ok", "disabled") for v in metadata.values()) and api_ok and restored
        return ok, {
            "metadata": metadata,
            "api_server": "ok" if api_ok else "unreachable",
            "restored": restored,
            # "disk" while the pods are known only from the pod file (the API server has not
            # answered a list since the start): workers are answered, nothing is written.
            "pods_from": self._pods.origin,
            # No GPU or no driver is a state of the node, not a reason to stop serving.
            "gpu": self._gpu.state if self._gpu is not None else "disabled",
            # Which pod holds which GPU (the kubelet's PodResources socket): without it, GPU
            # faults reach no pod, but nothing else is held up.
            "gpu_allocation": self._gpu.allocation if self._gpu is not None else "disabled",
        }
