"""Binding and user-facing status: the :class:`~scheduler.runner.Binder` and
:class:`~scheduler.runner.Reporter` on the Kubernetes API (plain JSON through
:class:`~scheduler.k8s.client.Rest`; these are the per-pod writes).

Writes that only inform (conditions, Events, PodGroup status) go through a small worker pool so
the scheduling loop never waits on them, and each is sent only when its content changes.

Events about a gang that waits (it does not fit, it lacks members) are aggregated: one per
gang, per reason, per ``event_interval``, on the gang's PodGroup (when it has one) and on its
first member pod; every member still gets the ``PodScheduled`` condition with the reason. A gang
that stays unschedulable for an hour produces a few Events, not one per member per cycle. A torn
gang's warnings (``GangBelowMinimum``, ``GangReleased``) go on each of its surviving members and
its PodGroup, once per message each: a pod deleted in the same burst takes no explanation with
it (:mod:`scheduler.torn`).

A condition write carries the pod's ``resourceVersion`` as read when the decision was made: a
write queued before the pod was bound fails with a conflict instead of overwriting the
``PodScheduled=True`` that the binding set.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import structlog

from common.kubeevents import EventSource, event_body
from contracts import names
from contracts.times import format_time
from scheduler import torn as torn_core
from scheduler.gang import why
from scheduler.gang.build import gang_of
from scheduler.gang.group_status import GroupStatus
from scheduler.gang.kinds import KINDS, ConditionPatch, GroupWrite, Kinds, PodGroupKind
from scheduler.k8s.client import ApiError, Rest, TokenBucket, pod_path
from scheduler.model import Gang, GangKey, InvalidGang, NodeName, PodGroup, PodRequest

log = structlog.get_logger("scheduler.status")

#: How many (object, kind of write) pairs the reporter remembers to avoid repeating itself.
MAX_REMEMBERED = 100_000


class ApiBinder:
    """``pods/binding``, the leave-by notice and evictions, rate limited. Thread-safe: called
    from the bind workers."""

    def __init__(
        self,
        api: Any,
        limiter: TokenBucket,
        node_exists: Callable[[NodeName], bool] = lambda _: True,
    ) -> None:
        self._rest = Rest(api)
        self._limiter = limiter
        self._node_exists = node_exists

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
        self._limiter.acquire()
        # Checked once the rate limiter lets the request go (it may have waited): the API
        # server accepts a binding to a node that does not exist.
        if not self._node_exists(node):
            return f"node {node} no longer exists"
        try:
            self._rest.call("POST", pod_path(pod.namespace, pod.name, "binding"), body)
        except ApiError as exc:
            return str(exc)
        return None

    def ask_to_leave(self, pod: PodRequest, leave_by: float, gang: GangKey) -> str | None:
        body = {
            "metadata": {
                "annotations": {
                    names.LEAVE_BY_ANNOTATION: format_time(leave_by),
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
        event_interval: float = 30.0,
        condition_interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        kinds: Kinds = KINDS,
        served: Callable[[PodGroupKind], str] | None = None,
    ) -> None:
        self._rest = Rest(api)
        self._kinds = kinds
        #: The version of each PodGroup kind the API server serves (its informer found it).
        self._served = served or (lambda kind: kind.api.versions[0])
        self._limiter = limiter
        self._name = scheduler_name
        self._instance = f"{scheduler_name}-{uuid.uuid4().hex[:8]}"
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="status")
        self._sent: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        self._backlog = 0
        self._max_backlog = max_backlog
        self.dropped = 0
        self._event_interval = event_interval
        self._condition_interval = condition_interval
        # gang -> when members already told were last told a newer message.
        self._gang_conditions: dict[GangKey, float] = {}
        self._clock = clock
        # ("gang-event", "gang|reason") -> when its last gang Event was sent, and what it said.
        self._gang_events: dict[tuple[str, str], tuple[float, str]] = {}
        # PodGroup status not yet written, newest only, per object and kind of write
        # ("ref|status", "ref|<condition type>"); writes to one object hold one of these
        # locks, so that an older status never lands after a newer one.
        #: The newest status write asked for each group: the write and its arguments.
        self._group_latest: dict[str, tuple[Callable[..., None], tuple[Any, ...]]] = {}
        self._group_locks = tuple(threading.Lock() for _ in range(16))

    @property
    def backlog(self) -> int:
        """Writes submitted and not yet finished (at most ``max_backlog``)."""
        return self._backlog

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- Reporter --------------------------------------------------------------------------------
    def unschedulable(
        self, gang: Gang, pods: Sequence[PodRequest], message: str, *, waiting: bool = False
    ) -> None:
        self._conditions(gang, pods, "Unschedulable", message)
        # Members still being created (WaitingForMembers), or members run and the rest of a
        # (raised) minimum waits for room (WaitingForRoom, not held back by an earlier
        # FailedScheduling) are normal for a gang, not a failure that should stay behind as a
        # warning once it runs. The same rule names the reason in `kubectl shoal why` and the
        # web view.
        reason = why.told_reason(gang, waiting)
        kind = "Warning" if reason == "FailedScheduling" else "Normal"
        self._gang_event(gang, pods, kind, reason, message)

    def _conditions(
        self, gang: Gang | InvalidGang, pods: Sequence[PodRequest], reason: str, message: str
    ) -> None:
        """``PodScheduled=False`` with ``message`` on each of ``pods``: at once on a pod that
        has none from us; on one that has an older message, at most once per
        ``condition_interval`` per gang (a gang whose members arrive one by one changes its
        count with each, and rewriting every member each time is quadratic)."""
        now = self._clock()
        with self._lock:
            refresh = now - self._gang_conditions.get(gang.key, -1e18) >= self._condition_interval
        refreshed = False
        for pod in pods:
            key = ("pod", pod.key)
            with self._lock:
                told = self._sent.get(key)
                if told == message or (told is not None and not refresh):
                    continue
                if len(self._sent) >= MAX_REMEMBERED:
                    self._sent.clear()
                self._sent[key] = message
            refreshed = True
            self._submit(self._pod_condition, pod, reason, message, remembered=key)
        if refreshed:
            with self._lock:
                if len(self._gang_conditions) >= MAX_REMEMBERED:
                    self._gang_conditions.clear()
                self._gang_conditions[gang.key] = now

    def torn(self, gang: Gang, release_at: float) -> None:
        """``GangBelowMinimum`` on every surviving member (bound, not being deleted) and on the
        PodGroup, each once per message: a member told that goes away leaves the explanation on
        the others, and a message that changes (counts, survivors) is written again."""
        message = torn_core.below_minimum_message(
            gang.name, torn_core.Shortfall.of(gang), release_at
        )
        self._on_survivors(gang, "Warning", "GangBelowMinimum", message)

    def released(self, gang: Gang, since: float, leave_by: float) -> None:
        message = torn_core.released_message(
            gang.name, torn_core.Shortfall.of(gang), since, leave_by
        )
        self._on_survivors(gang, "Warning", "GangReleased", message)

    def _on_survivors(self, gang: Gang, kind: str, reason: str, message: str) -> None:
        for pod in torn_core.survivors(gang):
            key: tuple[str, str] = (reason, pod.key)
            if self._changed(key, message):
                self._submit(self._pod_event, pod, kind, reason, message, remembered=key)
        if gang.pod_group and self._changed((reason, gang.pod_group), message):
            self._tell_group(gang, (kind, reason, message), (reason, gang.pod_group))

    def scheduled(self, gang: Gang, pod: PodRequest, node: NodeName) -> None:
        with self._lock:
            self._sent.pop(("pod", pod.key), None)
        message = f"Successfully assigned {pod.key} to {node}"
        self._submit(self._pod_event, pod, "Normal", "Scheduled", message)

    def bind_failed(self, pod: PodRequest, node: NodeName, error: str) -> None:
        message = f"Binding to {node} failed: {error}"
        self._submit(self._pod_event, pod, "Warning", "FailedBinding", message)

    def asked_to_leave(self, pod: PodRequest, gang: Gang, leave_by: float, why: str = "") -> None:
        own = any(member.key == pod.key for member in gang.members)
        if own and why:
            # Its node is expected to go: a surplus member moves before any notice.
            message = (
                f"Asked to leave by {format_time(leave_by)} (annotation "
                f"{names.LEAVE_BY_ANNOTATION}): {why}; evicted once its worker acknowledges, "
                "or then"
            )
            self._submit(self._pod_event, pod, "Warning", "Reclaimed", message)
            return
        if own:
            # Its own gang's maximum was lowered below its bound members (a stage change).
            message = (
                f"Asked to leave by {format_time(leave_by)} (annotation "
                f"{names.LEAVE_BY_ANNOTATION}): gang {gang.key}'s maximum is now "
                f"{gang.max_member} with {len(gang.bound)} bound, and its youngest members "
                "above it leave; evicted once its worker acknowledges, or then"
            )
            self._submit(self._pod_event, pod, "Warning", "Reclaimed", message)
            return
        message = (
            f"Asked to leave by {format_time(leave_by)} (annotation {names.LEAVE_BY_ANNOTATION}) "
            f"to make room for gang {gang.key} (priority {gang.priority}); evicted then"
        )
        if why:
            message = f"{message}. Why this pod: {why}"
        self._submit(self._pod_event, pod, "Warning", "Reclaimed", message)
        ref = gang_of(pod, self._kinds)[1]
        if ref is not None:
            self._disrupted(ref, gang)

    def _disrupted(self, ref: str, preemptor: Gang) -> None:
        """What the PodGroup ``ref``'s kind writes when its members are asked to leave for
        ``preemptor`` (Kubernetes': ``DisruptionTarget``); once per group and preemptor, newest
        last."""
        write = self._kinds.of_ref(ref).disrupted(self._name, preemptor)
        key = ("disruption", ref)
        if write is not None and self._changed(key, f"{preemptor.key}|{write!r}"):
            self._group_write(ref, write, key)

    def resize_blocked(self, pod: PodRequest, message: str) -> None:
        """A ``ResizeDoesNotFit`` Warning on a pod whose in-place resize does not fit on its
        node, once per message."""
        key = ("ResizeDoesNotFit", pod.key)
        if self._changed(key, message):
            self._submit(
                self._pod_event, pod, "Warning", "ResizeDoesNotFit", message, remembered=key
            )

    def nominated(self, pod: PodRequest, node: NodeName) -> None:
        key = ("nominated", pod.key)
        if self._changed(key, node):
            self._submit(self._pod_nomination, pod, node, remembered=key)

    def invalid(self, gang: InvalidGang) -> None:
        message = gang.message
        if gang.reason == "InvalidGang":
            message = f"Gang {gang.key} is not valid: {gang.message}"
        ours = [p for p in gang.members if p.node is None and p.scheduler_name == self._name]
        self._conditions(gang, ours, gang.reason, message)
        self._gang_event(gang, ours, "Warning", gang.reason, message)

    def group_status(self, group: PodGroup, status: GroupStatus) -> None:
        """Status computed from a PodGroup's members (a kind whose ``status_from_members``)."""
        key = ("status", f"{group.ref}|{group.uid}")
        if self._changed(key, repr(sorted(status.body().items()))):
            self._group_write(group.ref, status.write(group), key)

    def gang_status(self, gang: Gang) -> None:
        """Status and one-time notices on the gang's PodGroup, as its kind writes them."""
        ref = gang.pod_group
        if ref is None:
            return
        if gang.pod_group_notice and self._changed(("notice", ref), gang.pod_group_notice):
            notice = ("Normal", "FieldIgnored", gang.pod_group_notice)
            self._tell_group(gang, notice, ("notice", ref))
        write = self._kinds.of_ref(ref).status(gang)
        key = ("status", ref)
        if write is not None and self._changed(key, repr(write)):
            # In order, newest last: a waiting gang's False landing after its True would stay
            # (a sticky True is never written twice).
            self._group_write(ref, write, key)

    def _group_write(self, ref: str, write: GroupWrite, remembered: tuple[str, str]) -> None:
        latest = f"{ref}|{write.what}"
        with self._lock:
            self._group_latest[latest] = (self._write_group, (ref, write))
        self._submit(self._latest_group_status, latest, remembered=remembered)

    # -- plumbing --------------------------------------------------------------------------------
    def _gang_event(
        self,
        gang: Gang | InvalidGang,
        pods: Sequence[PodRequest],
        kind: str,
        reason: str,
        message: str,
    ) -> None:
        """One Event for the whole gang, on its PodGroup and its first pod in ``pods``: sent
        when the message is new, at most once per ``event_interval`` per gang and reason."""
        key = ("gang-event", f"{gang.key}|{reason}")
        now = self._clock()
        with self._lock:
            last = self._gang_events.get(key)
            if last is not None and (last[1] == message or now - last[0] < self._event_interval):
                return
            if len(self._gang_events) >= MAX_REMEMBERED:
                self._gang_events.clear()
            self._gang_events[key] = (now, message)
        if pods:
            self._submit(self._pod_event, pods[0], kind, reason, message, remembered=key)
        self._tell_group(gang, (kind, reason, message), key)

    def _tell_group(
        self, gang: Gang | InvalidGang, event: tuple[str, str, str], key: tuple[str, str]
    ) -> None:
        """The Event ``event`` (type, reason, message) on the gang's PodGroup, if it has one."""
        if gang.pod_group:
            args = (gang.pod_group, *event, gang.pod_group_uid)
            self._submit(self._group_event, *args, remembered=key)

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
                    self._gang_events.pop(remembered, None)
                return
            self._backlog += 1
        self._pool.submit(self._guarded, fn, *args, remembered=remembered)

    def _guarded(self, fn: Any, *args: Any, remembered: tuple[str, str] | None = None) -> None:
        try:
            self._limiter.acquire()
            fn(*args)
        except ApiError as exc:
            if exc.status == 409:
                # A precondition failed: the pod changed (it may be bound) since the decision.
                # Nothing is written; a later cycle sends it again if it is still true.
                self._forget(remembered)
            elif exc.status != 404:  # the object went away meanwhile: nothing to tell
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
                self._gang_events.pop(remembered, None)

    def _pod_nomination(self, pod: PodRequest, node: NodeName) -> None:
        self._rest.call(
            "PATCH",
            pod_path(pod.namespace, pod.name, "status"),
            {"status": {"nominatedNodeName": node}},
            content_type="application/strategic-merge-patch+json",
        )

    def _pod_condition(self, pod: PodRequest, reason: str, message: str) -> None:
        body: dict[str, Any] = {
            "status": {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": reason,
                        "message": message,
                        "lastTransitionTime": format_time(time.time()),
                    }
                ]
            }
        }
        if pod.resource_version:
            body["metadata"] = {"resourceVersion": pod.resource_version}
        self._rest.call(
            "PATCH",
            pod_path(pod.namespace, pod.name, "status"),
            body,
            content_type="application/strategic-merge-patch+json",
        )

    def _event(
        self, namespace: str, involved: dict[str, str], kind: str, reason: str, message: str
    ) -> None:
        involved = {**involved, "namespace": namespace}
        by = EventSource(self._name, self._instance)
        body = event_body(involved, kind, reason, message, by=by, now=time.time())
        self._rest.call("POST", f"/api/v1/namespaces/{quote(namespace, safe='')}/events", body)

    def _pod_event(self, pod: PodRequest, kind: str, reason: str, message: str) -> None:
        involved = {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}
        self._event(pod.namespace, involved, kind, reason, message)

    def _group_event(self, ref: str, kind: str, reason: str, message: str, uid: str) -> None:
        of = self._kinds.of_ref(ref)
        namespace, involved = of.involved(ref, uid, self._served(of))
        self._event(namespace, involved, kind, reason, message)

    def _latest_group_status(self, key: str) -> None:
        """Write the newest status asked for the group ``key``, if no write took it already:
        the worker pool runs writes in any order, and the PodGroup must end up with the last.
        Writes to one object (``key`` up to ``|``) take one lock, whatever they write."""
        lock = self._group_locks[hash(key.split("|", 1)[0]) % len(self._group_locks)]
        with lock:
            with self._lock:
                latest = self._group_latest.pop(key, None)
            if latest is not None:
                write, args = latest
                write(*args)

    def _write_group(self, ref: str, write: GroupWrite) -> None:
        """``write`` on the PodGroup ``ref``, in the version its informer reads: a condition
        merged with the object's own (read first), else a merge patch of ``status``."""
        kind = self._kinds.of_ref(ref)
        path = kind.path(ref, self._served(kind))
        if isinstance(write, ConditionPatch):
            written = write.merged(self._rest.get(path), _now())
            if written is None:
                return  # a sticky True is for good: a gang torn later does not undo it
            self._rest.call(
                "PATCH",
                f"{path}/status",
                {"status": {"conditions": [written]}},
                content_type="application/strategic-merge-patch+json",
            )
            return
        body: dict[str, Any] = {"status": dict(write.status)}
        if write.uid:
            body["metadata"] = {"uid": write.uid}
        path = f"{path}/status" if write.subresource else path
        self._rest.call("PATCH", path, body, content_type="application/merge-patch+json")


def _now() -> str:
    return format_time(time.time())
