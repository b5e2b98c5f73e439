"""Binding and user-facing status: the :class:`~scheduler.runner.Binder` and
:class:`~scheduler.runner.Reporter` on the Kubernetes API (plain JSON through
:class:`~scheduler.k8s.client.Rest`; these are the per-pod writes).

Writes that only inform (conditions, Events, PodGroup status) go through a small worker pool so
the scheduling loop never waits on them, and each is sent only when its content changes: a gang
that stays unschedulable for an hour produces one Event per member, not one per cycle.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import structlog

from contracts import names
from scheduler.k8s.client import ApiError, Rest, TokenBucket, pod_path
from scheduler.model import Gang, GangKey, InvalidGang, NodeName, PodPhase, PodRequest

log = structlog.get_logger("scheduler.status")

POD_GROUP_API = ("scheduling.x-k8s.io", "v1alpha1", "podgroups")
#: How many (object, kind of write) pairs the reporter remembers to avoid repeating itself.
MAX_REMEMBERED = 100_000


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiBinder:
    """``pods/binding``, the leave-by notice and evictions, rate limited. Thread-safe: called
    from the bind workers."""

    def __init__(self, api: Any, limiter: TokenBucket) -> None:
        self._rest = Rest(api)
        self._limiter = limiter

    def _send(self, method: str, path: str, body: dict[str, Any], **kw: Any) -> str | None:
        self._limiter.acquire()
        try:
            self._rest.call(method, path, body, **kw)
        except ApiError as exc:
            return str(exc)
        return None

    def bind(self, pod: PodRequest, node: NodeName) -> str | None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        return self._send("POST", pod_path(pod.namespace, pod.name, "binding"), body)

    def ask_to_leave(self, pod: PodRequest, leave_by: float, gang: GangKey) -> str | None:
        body = {
            "metadata": {
                "annotations": {
                    names.LEAVE_BY_ANNOTATION: _rfc3339(leave_by),
                    names.RECLAIMED_FOR_ANNOTATION: gang,
                }
            }
        }
        return self._send(
            "PATCH",
            pod_path(pod.namespace, pod.name),
            body,
            content_type="application/merge-patch+json",
        )

    def evict(self, pod: PodRequest) -> str | None:
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod.name, "namespace": pod.namespace},
        }
        self._limiter.acquire()
        try:
            self._rest.call("POST", pod_path(pod.namespace, pod.name, "eviction"), body)
        except ApiError as exc:
            return None if exc.status == 404 else str(exc)  # 404: already gone
        return None


def _rfc3339(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiReporter:
    """Pod conditions, Events on pods and PodGroups, and PodGroup status."""

    def __init__(
        self,
        api: Any,
        limiter: TokenBucket,
        scheduler_name: str,
        *,
        workers: int = 4,
        max_backlog: int = 5000,
    ) -> None:
        self._rest = Rest(api)
        self._limiter = limiter
        self._name = scheduler_name
        self._instance = f"{scheduler_name}-{uuid.uuid4().hex[:8]}"
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="status")
        self._sent: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        self._backlog = 0
        self._max_backlog = max_backlog
        self.dropped = 0

    @property
    def backlog(self) -> int:
        """Writes submitted and not yet finished (at most ``max_backlog``)."""
        return self._backlog

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- Reporter --------------------------------------------------------------------------------
    def unschedulable(self, gang: Gang, pods: Sequence[PodRequest], message: str) -> None:
        for pod in pods:
            key = ("pod", pod.key)
            if self._changed(key, message):
                self._submit(self._pod_condition, pod, "Unschedulable", message, remembered=key)
                self._submit(
                    self._pod_event, pod, "Warning", "FailedScheduling", message, remembered=key
                )
        group = ("group", gang.pod_group or "")
        if gang.pod_group and self._changed(group, message):
            self._submit(
                self._group_event,
                gang.pod_group,
                "Warning",
                "FailedScheduling",
                message,
                remembered=group,
            )

    def scheduled(self, gang: Gang, pod: PodRequest, node: NodeName) -> None:
        with self._lock:
            self._sent.pop(("pod", pod.key), None)
        message = f"Successfully assigned {pod.key} to {node}"
        self._submit(self._pod_event, pod, "Normal", "Scheduled", message)

    def bind_failed(self, pod: PodRequest, node: NodeName, error: str) -> None:
        message = f"Binding to {node} failed: {error}"
        self._submit(self._pod_event, pod, "Warning", "FailedBinding", message)

    def asked_to_leave(self, pod: PodRequest, gang: Gang, leave_by: float) -> None:
        message = (
            f"Asked to leave by {_rfc3339(leave_by)} (annotation {names.LEAVE_BY_ANNOTATION}) "
            f"to make room for gang {gang.key} (priority {gang.priority}); evicted then"
        )
        self._submit(self._pod_event, pod, "Warning", "Reclaimed", message)

    def nominated(self, pod: PodRequest, node: NodeName) -> None:
        key = ("nominated", pod.key)
        if self._changed(key, node):
            self._submit(self._pod_nomination, pod, node, remembered=key)

    def invalid(self, gang: InvalidGang) -> None:
        message = f"Gang {gang.key} is not valid: {gang.message}"
        for pod in gang.members:
            ours = pod.node is None and pod.scheduler_name == self._name
            key = ("pod", pod.key)
            if ours and self._changed(key, message):
                self._submit(self._pod_condition, pod, "InvalidGang", message, remembered=key)
                self._submit(
                    self._pod_event, pod, "Warning", "InvalidGang", message, remembered=key
                )
        group = ("group", gang.pod_group or "")
        if gang.pod_group and self._changed(group, message):
            self._submit(
                self._group_event,
                gang.pod_group,
                "Warning",
                "InvalidGang",
                message,
                remembered=group,
            )

    def gang_status(self, gang: Gang) -> None:
        if gang.pod_group is None:
            return
        scheduled = len(gang.bound)
        running = sum(1 for p in gang.members if p.phase == PodPhase.RUNNING)
        if running >= gang.min_member:
            phase = "Running"
        elif scheduled >= gang.min_member:
            phase = "Scheduled"
        else:
            phase = "Pending"
        status = {"phase": phase, "scheduled": scheduled, "running": running}
        key = ("status", gang.pod_group)
        if self._changed(key, repr(sorted(status.items()))):
            self._submit(self._group_status, gang.pod_group, status, remembered=key)

    # -- plumbing --------------------------------------------------------------------------------
    def _changed(self, key: tuple[str, str], content: str) -> bool:
        with self._lock:
            if self._sent.get(key) == content:
                return False
            if len(self._sent) >= MAX_REMEMBERED:
                # Pods come and go; forgetting everything at once costs one repeated write per
                # object still waiting, and keeps memory bounded without tracking deletions.
                self._sent.clear()
            self._sent[key] = content
            return True

    def _submit(self, fn: Any, *args: Any, remembered: tuple[str, str] | None = None) -> None:
        """Queue a write. ``remembered`` is the ``_changed`` key it reports: a write that is
        dropped (backlog full) or fails is forgotten there, so a later cycle sends it again
        instead of taking it as already told."""
        with self._lock:
            if self._backlog >= self._max_backlog:
                self.dropped += 1
                if remembered is not None:
                    self._sent.pop(remembered, None)
                return
            self._backlog += 1
        self._pool.submit(self._guarded, fn, *args, remembered=remembered)

    def _guarded(self, fn: Any, *args: Any, remembered: tuple[str, str] | None = None) -> None:
        try:
            self._limiter.acquire()
            fn(*args)
        except ApiError as exc:
            if exc.status != 404:  # the object went away meanwhile: nothing to tell
                self._forget(remembered)
                log.warning(
                    "status_write_failed", action=fn.__name__, status=exc.status, error=str(exc)
                )
        except Exception:
            self._forget(remembered)
            log.exception("status_write_crashed", action=fn.__name__)
        finally:
            with self._lock:
                self._backlog -= 1

    def _forget(self, remembered: tuple[str, str] | None) -> None:
        if remembered is not None:
            with self._lock:
                self._sent.pop(remembered, None)

    def _pod_nomination(self, pod: PodRequest, node: NodeName) -> None:
        self._rest.call(
            "PATCH",
            pod_path(pod.namespace, pod.name, "status"),
            {"status": {"nominatedNodeName": node}},
            content_type="application/strategic-merge-patch+json",
        )

    def _pod_condition(self, pod: PodRequest, reason: str, message: str) -> None:
        body = {
            "status": {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": reason,
                        "message": message,
                        "lastTransitionTime": _now(),
                    }
                ]
            }
        }
        self._rest.call(
            "PATCH",
            pod_path(pod.namespace, pod.name, "status"),
            body,
            content_type="application/strategic-merge-patch+json",
        )

    def _event(
        self, namespace: str, involved: dict[str, str], kind: str, reason: str, message: str
    ) -> None:
        now = _now()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
            "involvedObject": {**involved, "namespace": namespace},
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": self._name},
            "reportingComponent": self._name,
            "reportingInstance": self._instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._rest.call("POST", f"/api/v1/namespaces/{quote(namespace, safe='')}/events", body)

    def _pod_event(self, pod: PodRequest, kind: str, reason: str, message: str) -> None:
        involved = {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}
        self._event(pod.namespace, involved, kind, reason, message)

    def _group_event(self, ref: str, kind: str, reason: str, message: str) -> None:
        namespace, name = ref.split("/", 1)
        group, version, _ = POD_GROUP_API
        involved = {"apiVersion": f"{group}/{version}", "kind": "PodGroup", "name": name}
        self._event(namespace, involved, kind, reason, message)

    def _group_status(self, ref: str, status: dict[str, Any]) -> None:
        namespace, name = ref.split("/", 1)
        group, version, plural = POD_GROUP_API
        path = (
            f"/apis/{group}/{version}/namespaces/{quote(namespace, safe='')}/{plural}/"
            f"{quote(name, safe='')}/status"
        )
        self._rest.call(
            "PATCH", path, {"status": status}, content_type="application/merge-patch+json"
        )
