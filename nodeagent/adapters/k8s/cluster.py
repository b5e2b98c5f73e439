"""Node and pod reads and writes for one node: taint, annotations, Events, eviction.

Requests are plain REST calls on raw JSON through a :mod:`nodeagent.adapters.k8s.transport`; the
JSON is
converted to our own types here. The generated per-resource API classes are not used:
instantiating ``CoreV1Api`` alone costs about 22 MiB of resident memory (its validators), more
than everything the agent does with it.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import structlog
from urllib3.exceptions import HTTPError

from common.kubeevents import EventSource, event_body
from common.listwatch import WatchError, decode
from contracts import names
from nodeagent.adapters.calls import WatchExpired
from nodeagent.adapters.k8s.transport import Stream, Transport, connect
from nodeagent.core.events import (
    EventId,
    Kind,
    NodeTaints,
    Notice,
    Pod,
    PodEvent,
    PodKey,
    PodUid,
    Tracked,
    parse_rfc3339,
    rfc3339,
)
from nodeagent.core.ports import Change, PodChange

#: Told of each answer: when the request was sent and its answer received (the local clock,
#: seconds since the epoch) and the answer's ``Date`` header (see :mod:`nodeagent.wiring.clock`).
DateProbe = Callable[[float, float, str | None], None]

log = structlog.get_logger("nodeagent.adapters.k8s")

COMPONENT = "shoal-nodeagent"
_TERMINAL = ("Succeeded", "Failed")
_MERGE = "application/merge-patch+json"
T = TypeVar("T")

#: Seconds a watch may stay silent beyond its server-side timeout before the client gives up.
WATCH_MARGIN = 30


class ApiError(Exception):
    """The API server could not be reached or refused a request the agent needed."""


class ApiStatus(ApiError):
    """The API server answered with an error status."""

    def __init__(self, message: str, status: int, reason: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


def encode_revocation(tracked: Sequence[Tracked]) -> str:
    """The ``shoal.dev/revocation`` value: the most urgent notice's source, event id and deadline
    at the top level (what people and the scheduler read), every live notice under ``notices``
    (what a restarted agent reads)."""
    first = tracked[0].notice
    doc = {
        "source": first.source,
        "event_id": first.event_id,
        "deadline": rfc3339(first.deadline),
        "kind": first.kind.value,
        "reason": first.reason,
        "notices": [
            {
                "event_id": t.notice.event_id,
                "source": t.notice.source,
                "channel": t.notice.channel,
                "kind": t.notice.kind.value,
                "deadline": rfc3339(t.notice.deadline),
                "reason": t.notice.reason,
                "disruptive": t.notice.disruptive,
                "upstream_id": t.notice.upstream_id,
                "first_seen": rfc3339(t.first_seen),
                "upstream_acked": t.upstream_acked,
            }
            for t in tracked
        ],
    }
    return json.dumps(doc, separators=(",", ":"))


def decode_revocation(text: str) -> list[Tracked]:
    """Parse what :func:`encode_revocation` wrote; raises ``ValueError`` naming the field."""
    try:
        doc = json.loads(text)
    except RecursionError as exc:  # a JSON value nested thousands deep
        raise ValueError("not JSON: nested too deep") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("notices"), list):
        raise ValueError("notices: missing")
    tracked: list[Tracked] = []
    for i, raw in enumerate(doc["notices"]):
        try:
            upstream = raw.get("upstream_id")
            notice = Notice(
                event_id=EventId(str(raw["event_id"])),
                source=str(raw["source"]),
                channel=str(raw["channel"]),
                kind=Kind(raw["kind"]),
                deadline=parse_rfc3339(raw["deadline"]),
                reason=str(raw.get("reason", "")),
                disruptive=bool(raw.get("disruptive", True)),
                upstream_id=None if upstream is None else str(upstream),
            )
            tracked.append(
                Tracked(
                    notice=notice,
                    first_seen=parse_rfc3339(raw["first_seen"]),
                    upstream_acked=bool(raw.get("upstream_acked", False)),
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"notices[{i}]: {exc}") from exc
    return tracked


@dataclass(frozen=True, slots=True)
class ConditionRule:
    """A pod condition that announces the pod's removal: ``Type=Status`` or
    ``Type=Status:Reason``."""

    type: str
    status: str
    reason: str | None = None

    @classmethod
    def parse(cls, text: str) -> ConditionRule:
        kind, sep, rest = text.partition("=")
        status, _, reason = rest.partition(":")
        if not sep or not kind.strip() or not status.strip():
            raise ValueError(f"expected Type=Status or Type=Status:Reason, got {text!r}")
        return cls(kind.strip(), status.strip(), reason.strip() or None)


def matching_condition(condition: dict[str, Any], rules: frozenset[ConditionRule]) -> str | None:
    """A description of ``condition`` when one of ``rules`` matches it."""
    for rule in rules:
        if condition.get("type") != rule.type or condition.get("status") != rule.status:
            continue
        if rule.reason is not None and condition.get("reason") != rule.reason:
            continue
        detail = condition.get("reason") or condition.get("message") or ""
        return f"condition {rule.type}={rule.status}" + (f" ({detail})" if detail else "")
    return None


def _pod(raw: dict[str, Any], conditions: frozenset[ConditionRule] = frozenset()) -> Pod:
    meta = raw.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    owners = meta.get("ownerReferences") or []
    daemon = any(o.get("kind") == "DaemonSet" for o in owners) or (
        "kubernetes.io/config.mirror" in annotations
    )
    worker = names.GANG_LABEL in labels or names.POD_GROUP_LABEL in labels
    leave_by = None
    if names.LEAVE_BY_ANNOTATION in annotations:
        try:
            leave_by = parse_rfc3339(annotations[names.LEAVE_BY_ANNOTATION])
        except ValueError:
            leave_by = None
    checkpoint_seconds = None
    if names.CHECKPOINT_SECONDS_ANNOTATION in annotations:
        # A bad value was told at admission (the webhook's wiring warning): ignored here.
        try:
            text = str(annotations[names.CHECKPOINT_SECONDS_ANNOTATION])
            checkpoint_seconds = names.parse_checkpoint_seconds(text)
        except ValueError:
            checkpoint_seconds = None
    return Pod(
        key=PodKey(f"{meta.get('namespace')}/{meta.get('name')}"),
        uid=PodUid(str(meta.get("uid"))),
        worker=worker,
        daemon=daemon,
        leave_by=leave_by,
        leaving=meta.get("deletionTimestamp") is not None,
        reclaimed_for=annotations.get(names.RECLAIMED_FOR_ANNOTATION) or None,
        checkpoint_seconds=checkpoint_seconds,
        warning=_warning(raw, conditions) if conditions else None,
    )


def _warning(raw: dict[str, Any], rules: frozenset[ConditionRule]) -> str | None:
    for condition in (raw.get("status") or {}).get("conditions") or []:
        what = matching_condition(condition, rules)
        if what is not None:
            return what
    return None


def _finished(raw: dict[str, Any]) -> bool:
    return ((raw.get("status") or {}).get("phase") or "") in _TERMINAL


def _never(_raw: dict[str, Any]) -> bool:
    return False


def watch_change(
    event: dict[str, Any],
    parse: Callable[[dict[str, Any]], T],
    finished: Callable[[dict[str, Any]], bool] = _never,
) -> Change[T] | None:
    """One line of a watch (read by :func:`common.listwatch.decode`) as a change (an object
    that is ``finished`` is gone); None for an event of no other type. Raises
    :class:`WatchExpired` on a 410 ``ERROR`` event, :class:`ApiError` on another."""
    try:
        line = decode(event)
    except WatchError as exc:
        raise ApiError(f"watch: {exc}") from exc
    if line.type == "BOOKMARK":
        return Change(None, gone=False, version=line.version)
    if line.type not in ("ADDED", "MODIFIED", "DELETED"):
        return None
    gone = line.type == "DELETED" or finished(line.object)
    return Change(parse(line.object), gone=gone, version=line.version)


def pod_change(event: dict[str, Any]) -> PodChange | None:
    """One line of a pod watch as a change (see :func:`watch_change`)."""
    return watch_change(event, _pod, _finished)


def node_taints(raw: dict[str, Any]) -> NodeTaints:
    """(key, value) of each taint on a Node object."""
    taints = (raw.get("spec") or {}).get("taints") or []
    return tuple((str(t.get("key", "")), str(t.get("value") or "")) for t in taints)


def pod_event(raw: dict[str, Any]) -> PodEvent:
    """An Event object about a pod, as the pod-Event signal needs it."""
    involved = raw.get("involvedObject") or {}
    return PodEvent(
        uid=str((raw.get("metadata") or {}).get("uid")),
        pod=PodUid(str(involved.get("uid"))),
        reason=str(raw.get("reason") or ""),
        message=str(raw.get("message") or "")[:200],
    )


@dataclass(slots=True)
class ListWatch(Generic[T]):
    """The objects at ``path`` under the field selector ``selector``, listed then watched (a
    :class:`nodeagent.core.ports.Feed`): this node's pods, the Node itself, the Events of a
    reason.
    ``finished`` objects are left out of a list and gone from a watch."""

    cluster: Cluster
    what: str
    path: str
    selector: str
    parse: Callable[[dict[str, Any]], T]
    finished: Callable[[dict[str, Any]], bool] = _never
    #: The watch under way, if one is.
    _stream: Stream | None = field(default=None, init=False)

    def list_at(self) -> tuple[list[T], str]:
        """The objects that have not finished, and the list's resourceVersion."""
        answer = self.cluster.request(
            f"list {self.what}", "GET", self.path, query={"fieldSelector": self.selector}
        )
        version = str((answer.get("metadata") or {}).get("resourceVersion") or "")
        items = answer.get("items") or []
        return [self.parse(o) for o in items if not self.finished(o)], version

    def watch(self, version: str, timeout: int) -> Iterator[Change[T]]:
        """Each change after ``version`` (see :class:`nodeagent.core.ports.Feed`). The server
        ends
        the watch after ``timeout`` seconds; a read that waits :data:`WATCH_MARGIN` seconds
        longer (a silent, half-open connection) raises."""
        query = {
            "fieldSelector": self.selector,
            "watch": "true",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout),
        }
        what = f"watch {self.what}"
        sent = self.cluster.local()
        try:
            stream = self.cluster.transport.stream(self.path, query, timeout + WATCH_MARGIN)
        except (HTTPError, OSError) as exc:
            raise ApiError(f"{what}: API server unreachable: {exc}") from exc
        self.cluster.dated(sent, stream.date)
        self._stream = stream
        try:
            yield from self._changes(stream)
        except (HTTPError, OSError) as exc:
            raise ApiError(f"{what}: the watch broke: {exc}") from exc
        finally:
            self._stream = None
            stream.close()

    def _changes(self, stream: Stream) -> Iterator[Change[T]]:
        if stream.status >= 400:
            detail = stream.body().decode("utf-8", "replace")[:300]
            if stream.status == 410:
                raise WatchExpired(detail or "410 Gone")
            raise ApiStatus(f"watch {self.what}: HTTP {stream.status}: {detail}", stream.status, "")
        with self.cluster.watch_open():
            yield Change(None, gone=False, version="")  # answered: the watch is open
            for line in stream.lines():
                change = watch_change(json.loads(line), self.parse, self.finished)
                self.cluster.last_ok = time.monotonic()
                if change is not None:
                    yield change

    def stop_watch(self) -> None:
        stream = self._stream
        if stream is not None:
            stream.close()


@dataclass(slots=True)
class Cluster:
    """The API calls the agent makes, for the node ``node_name``."""

    transport: Transport
    node_name: str
    dry_run: bool = False
    #: The local clock the answers' ``Date`` headers are measured against, and who is told.
    local: Callable[[], float] = time.time
    on_date: DateProbe | None = None
    #: The clock Events are stamped with (the corrected one, :mod:`nodeagent.wiring.clock`).
    wall: Callable[[], float] = time.time
    _last_ok: float = field(default=0.0, init=False)
    #: How many watches the API server is answering now.
    _watches_open: int = field(default=0, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    @classmethod
    def connect(
        cls,
        kubeconfig: str | None,
        node_name: str,
        *,
        dry_run: bool,
        local: Callable[[], float] = time.time,
        on_date: DateProbe | None = None,
        wall: Callable[[], float] = time.time,
    ) -> Cluster:
        """From a kubeconfig file, or the pod's service account when ``kubeconfig`` is None."""

        def fallback(why: str) -> None:
            log.info("kubernetes_client_transport", reason=why)

        return cls(
            transport=connect(kubeconfig, on_fallback=fallback),
            node_name=node_name,
            dry_run=dry_run,
            local=local,
            on_date=on_date,
            wall=wall,
        )

    @property
    def last_ok(self) -> float:
        """Monotonic time of the last successful API call (for /readyz). While a watch is open
        the API server counts as answering now: a quiet watch sends nothing for minutes, and a
        silent connection ends after the watch's timeout plus :data:`WATCH_MARGIN`."""
        return time.monotonic() if self._watches_open else self._last_ok

    @last_ok.setter
    def last_ok(self, value: float) -> None:
        self._last_ok = value

    @contextlib.contextmanager
    def watch_open(self) -> Iterator[None]:
        """A watch the API server answered, open for the ``with`` block."""
        self.last_ok = time.monotonic()
        with self._lock:
            self._watches_open += 1
        try:
            yield
        finally:
            with self._lock:
                self._watches_open -= 1

    def pod_feed(self, conditions: frozenset[ConditionRule] = frozenset()) -> ListWatch[Pod]:
        """This node's pods that have not finished; each with its ``warning`` when it carries
        one of ``conditions``."""
        selector = f"spec.nodeName={self.node_name}"

        def parse(raw: dict[str, Any]) -> Pod:
            return _pod(raw, conditions)

        return ListWatch(self, "pods", "/api/v1/pods", selector, parse, _finished)

    def node_feed(self) -> ListWatch[NodeTaints]:
        """This node's taints (the Node named by its field selector)."""
        selector = f"metadata.name={self.node_name}"
        return ListWatch(self, "node", "/api/v1/nodes", selector, node_taints)

    def event_feed(self, reason: str) -> ListWatch[PodEvent]:
        """The Events of ``reason`` about pods, in every namespace (an Event's field selectors
        cannot name a node: :class:`nodeagent.adapters.providers.kube.KubeEventProvider` keeps those
        about this node's pods)."""
        selector = f"involvedObject.kind=Pod,reason={reason}"
        return ListWatch(self, f"events {reason}", "/api/v1/events", selector, pod_event)

    def close(self) -> None:
        self.transport.close()

    def request(
        self,
        what: str,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        """One API call on raw JSON; returns the decoded answer.

        Raises :class:`ApiStatus` for an error status and :class:`ApiError` when the server
        cannot be reached.
        """
        params = dict(query or {})
        if self.dry_run and method != "GET":
            params["dryRun"] = "All"
        sent = self.local()
        try:
            answer = self.transport.request(method, path, params, body, content_type)
        except (HTTPError, OSError) as exc:
            raise ApiError(f"{what}: API server unreachable: {exc}") from exc
        self.last_ok = time.monotonic()
        self.dated(sent, answer.date)
        if answer.status >= 400:
            detail = answer.body.decode("utf-8", "replace")[:300]
            raise ApiStatus(f"{what}: HTTP {answer.status}: {detail}", answer.status, answer.reason)
        return json.loads(answer.body) if answer.body else None

    def dated(self, sent: float, date: str | None) -> None:
        """An answer to a request sent at ``sent`` has just come, dated ``date``: the clock
        check hears of it (a watch's answer too, so a quiet agent keeps measuring)."""
        if self.on_date is not None:
            self.on_date(sent, self.local(), date)

    @property
    def _node_path(self) -> str:
        return f"/api/v1/nodes/{self.node_name}"

    # --- reads ---------------------------------------------------------------------------------

    def read_revocation(self) -> list[Tracked]:
        """What the node annotation says the agent was doing (empty when nothing or unreadable)."""
        node = self.request("read node", "GET", self._node_path)
        text = (node["metadata"].get("annotations") or {}).get(names.REVOCATION_ANNOTATION)
        if not text:
            return []
        try:
            return decode_revocation(text)
        except ValueError as exc:
            log.warning("revocation_annotation_unreadable", node=self.node_name, error=str(exc))
            return []

    def list_pods(self) -> list[Pod]:
        """This node's pods that have not finished."""
        return self.pod_feed().list_at()[0]

    # --- writes --------------------------------------------------------------------------------

    def sync_node(self, tracked: Sequence[Tracked]) -> None:
        """Taint and annotate the node for ``tracked`` (or clear both when it is empty)."""
        for _attempt in range(5):
            node = self.request("read node", "GET", self._node_path)
            meta, spec = node["metadata"], node.get("spec") or {}
            present = spec.get("taints") or []
            taints = [t for t in present if t.get("key") != names.REVOKING_TAINT]
            had_taint = len(taints) != len(present)
            annotation: str | None = None
            if tracked:
                first = tracked[0].notice
                taints.append(
                    {"key": names.REVOKING_TAINT, "value": first.source, "effect": "NoSchedule"}
                )
                annotation = encode_revocation(tracked)
            current = (meta.get("annotations") or {}).get(names.REVOCATION_ANNOTATION)
            if current == annotation and had_taint == bool(tracked):
                return
            body = {
                # resourceVersion makes this a compare-and-swap on the whole taint list.
                "metadata": {
                    "resourceVersion": meta["resourceVersion"],
                    "annotations": {names.REVOCATION_ANNOTATION: annotation},
                },
                "spec": {"taints": taints},
            }
            try:
                self.request("patch node", "PATCH", self._node_path, body=body, content_type=_MERGE)
            except ApiStatus as exc:
                if exc.status == 409:
                    continue
                raise
            ref = self._node_ref(meta["uid"])
            if tracked and not had_taint:
                first = tracked[0].notice
                self.event(
                    ref,
                    "Revoking",
                    f"{first.source} {first.kind.value} by {rfc3339(first.deadline)}: "
                    f"{first.reason} (event {first.event_id})",
                    "Warning",
                )
            elif not tracked and had_taint:
                self.event(ref, "RevocationWithdrawn", "The notice was withdrawn", "Normal")
            log.info(
                "node_synced",
                node=self.node_name,
                notices=[t.notice.event_id for t in tracked],
                dry_run=self.dry_run,
            )
            return
        raise ApiError("patch node: conflicting writers, gave up after 5 attempts")

    def write_topology(self, text: str) -> None:
        """The ``shoal.dev/gpu-topology`` annotation (see :mod:`contracts.gputopology`)."""
        body = {"metadata": {"annotations": {names.GPU_TOPOLOGY_ANNOTATION: text}}}
        self.request("patch node", "PATCH", self._node_path, body=body, content_type=_MERGE)
        log.info("gpu_topology_published", node=self.node_name, dry_run=self.dry_run)

    def _node_ref(self, uid: str) -> dict[str, Any]:
        return {"kind": "Node", "apiVersion": "v1", "name": self.node_name, "uid": uid}

    @staticmethod
    def _pod_ref(pod: Pod) -> dict[str, Any]:
        namespace, name = pod.key.split("/", 1)
        return {
            "kind": "Pod",
            "apiVersion": "v1",
            "namespace": namespace,
            "name": name,
            "uid": pod.uid,
        }

    def annotate_pod(self, pod: Pod, notice: Notice) -> bool:
        """``shoal.dev/leave-by`` and the reason, plus an Event. False when the pod is gone."""
        namespace, name = pod.key.split("/", 1)
        body = {
            "metadata": {
                "uid": pod.uid,
                "annotations": {
                    names.LEAVE_BY_ANNOTATION: rfc3339(notice.deadline),
                    names.LEAVE_REASON_ANNOTATION: f"{notice.source} {notice.kind.value}: "
                    f"{notice.reason}",
                },
            }
        }
        if not self._patch_pod(name, namespace, body):
            return False
        what = f"{notice.source} {notice.kind.value} ({notice.reason}, event {notice.event_id})"
        deadline = rfc3339(notice.deadline)
        if notice.deadline.timestamp() <= self.wall():
            message = f"Leave now: the deadline {deadline} had passed when the pod was told: {what}"
        else:
            message = f"Checkpoint and leave by {deadline}: {what}"
        self.event(self._pod_ref(pod), "LeaveBy", message, "Warning")
        log.info(
            "pod_notified",
            pod=pod.key,
            event_id=notice.event_id,
            deadline=rfc3339(notice.deadline),
            dry_run=self.dry_run,
        )
        return True

    def annotate_progress(self, pod: Pod, text: str) -> bool:
        """``shoal.dev/progress`` (the worker's newest report, :mod:`contracts.progress`); no
        Event. False when the pod is gone."""
        namespace, name = pod.key.split("/", 1)
        body = {"metadata": {"uid": pod.uid, "annotations": {names.PROGRESS_ANNOTATION: text}}}
        return self._patch_pod(name, namespace, body)

    def warn_pod(self, pod: Pod, reason: str, message: str) -> None:
        """A Warning Event on the pod; a failure is logged, never raised."""
        self.event(self._pod_ref(pod), reason, message, "Warning")

    def warn_node(self, reason: str, message: str) -> None:
        """A Warning Event on this node; a failure is logged, never raised."""
        try:
            node = self.request("read node", "GET", self._node_path)
        except ApiError as exc:
            log.warning("event_not_recorded", reason=reason, error=str(exc))
            return
        self.event(self._node_ref(node["metadata"]["uid"]), reason, message, "Warning")

    def clear_pod(self, pod: Pod) -> bool:
        namespace, name = pod.key.split("/", 1)
        body = {
            "metadata": {
                "uid": pod.uid,
                "annotations": {
                    names.LEAVE_BY_ANNOTATION: None,
                    names.LEAVE_REASON_ANNOTATION: None,
                },
            }
        }
        if not self._patch_pod(name, namespace, body):
            return False
        self.event(self._pod_ref(pod), "LeaveWithdrawn", "The notice was withdrawn", "Normal")
        return True

    def _patch_pod(self, name: str, namespace: str, body: dict[str, Any]) -> bool:
        try:
            self.request(
                "patch pod",
                "PATCH",
                f"/api/v1/namespaces/{namespace}/pods/{name}",
                body=body,
                content_type=_MERGE,
            )
        except ApiStatus as exc:
            # 404: gone; 409/422: the uid precondition failed (a new pod under the same name).
            if exc.status in (404, 409, 422):
                return False
            raise
        return True

    def evict(self, pod: Pod, reason: str) -> bool:
        """Evict through the Eviction API (PDBs respected; the API server adds the
        ``DisruptionTarget`` condition). False when refused (429: a PDB said no)."""
        namespace, name = pod.key.split("/", 1)
        delete_options: dict[str, Any] = {"preconditions": {"uid": pod.uid}}
        if self.dry_run:
            delete_options["dryRun"] = ["All"]
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": delete_options,
        }
        try:
            self.request(
                "evict pod",
                "POST",
                f"/api/v1/namespaces/{namespace}/pods/{name}/eviction",
                body=body,
            )
        except ApiStatus as exc:
            if exc.status in (404, 409):
                return True  # already gone, or a different pod now has the name
            if exc.status == 429:
                log.info("eviction_refused", pod=pod.key, reason=reason, detail=str(exc))
                return False
            raise
        log.info("pod_evicted", pod=pod.key, reason=reason, dry_run=self.dry_run)
        return True

    def delete(self, pod: Pod, grace_seconds: int) -> bool:
        namespace, name = pod.key.split("/", 1)
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": grace_seconds,
            "preconditions": {"uid": pod.uid},
        }
        try:
            self.request(
                "delete pod", "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body=body
            )
        except ApiStatus as exc:
            if exc.status in (404, 409):
                return True
            raise
        log.warning("pod_deleted", pod=pod.key, grace_seconds=grace_seconds, dry_run=self.dry_run)
        return True

    def event(self, involved: dict[str, Any], reason: str, message: str, kind: str) -> None:
        """Record a Kubernetes Event; a failure here is logged, never raised."""
        namespace = involved.get("namespace") or "default"
        by = EventSource(COMPONENT, self.node_name, host=self.node_name)
        body = event_body(involved, kind, reason, message, by=by, now=self.wall())
        try:
            self.request(
                "create event", "POST", f"/api/v1/namespaces/{namespace}/events", body=body
            )
        except ApiError as exc:
            log.warning("event_not_recorded", reason=reason, error=str(exc))
