"""The cluster view: informers for pods, nodes and PodGroups (every kind in
:data:`scheduler.gang.kinds.KINDS`, :mod:`scheduler.k8s.group_view`) that feed the cache and wake
the loop.

Event handlers only route: convert the object, update the cache, and tell the loop whether room
may have appeared (a pod gone or finished, a node added or changed, a new pod or PodGroup that
could complete a gang), in which case backoffs end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from kubernetes import client

from contracts import names
from scheduler.cache import Cache
from scheduler.gang.kinds import KINDS, Kinds, PodGroupKind
from scheduler.k8s import convert
from scheduler.k8s.group_view import GroupView
from scheduler.k8s.informer import Handlers, Informer
from scheduler.model import Node, NodeName, PodRequest

log = structlog.get_logger("scheduler.view")

Wake = Callable[[bool], None]
#: Told of each pod created while the view watches: (namespace, name, uid, annotations).
PodAdded = Callable[[str, str, str, Mapping[str, str]], None]
#: Told of a bound pod whose in-place resize does not fit on its node: (pod, why).
ResizeBlocked = Callable[[PodRequest, str], None]


class ClusterView:
    def __init__(
        self,
        api: Any,
        cache: Cache,
        wake: Wake,
        *,
        page_size: int = 500,
        pod_added: PodAdded | None = None,
        kinds: Kinds = KINDS,
        resize_blocked: ResizeBlocked | None = None,
    ) -> None:
        self._cache = cache
        self._wake = wake
        self._pod_added = pod_added
        self._resize_blocked = resize_blocked
        self._kinds = kinds
        self._node_problems: dict[str, str] = {}
        core = client.CoreV1Api(api)
        self._groups = GroupView(api, cache, wake, page_size=page_size, kinds=kinds)
        self.informers = [
            Informer(
                "pods",
                core.list_pod_for_all_namespaces,
                Handlers(self._pods_listed, self._pod_event),
                page_size=page_size,
            ),
            Informer(
                "nodes",
                core.list_node,
                Handlers(self._nodes_listed, self._node_event),
                page_size=page_size,
            ),
            *self._groups.informers,
        ]

    def served(self, kind: PodGroupKind) -> str:
        """The version of PodGroup ``kind`` the API server serves (its informer found it)."""
        return self._groups.served(kind)

    def start(self) -> None:
        for informer in self.informers:
            informer.start()

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop()

    def join(self, timeout: float) -> None:
        """Wait, at most ``timeout`` seconds in all, for the informers' threads to end (after
        :meth:`stop`), so that none is inside a request when the client closes."""
        deadline = time.monotonic() + timeout
        for informer in self.informers:
            informer.join(max(0.0, deadline - time.monotonic()))

    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers)

    # -- pods ------------------------------------------------------------------------------------
    def _pods_listed(self, items: list[dict[str, Any]]) -> None:
        self._cache.replace_pods(convert.pod(item) for item in items)
        self._wake(True)

    def _pod_event(self, kind: str, raw: dict[str, Any]) -> None:
        pod = convert.pod(raw)
        if kind == "DELETED":
            self._cache.remove_pod(pod.key)
            self._wake(True)
            return
        old = self._cache.set_pod(pod)
        if kind == "ADDED" and self._pod_added is not None:
            self._pod_added(pod.namespace, pod.name, pod.uid, pod.annotations)
        if pod.node is not None and pod.holds_resources and convert.resize_pending(raw):
            self._resize_fits(pod)
        # A new pod may complete a gang; a finished or leaving one frees its node. A PodGroup
        # member now Running changes its group's status only: the loop looks, no backoff ends.
        # A change of the gang's bounds (shoal.dev/min-member, max-member) or of what the pod
        # is counted for (an in-place resize) is acted on at once, not at the idle wake, and so
        # is its last scheduling gate removed (Kueue's admission): it ends its gang's backoff.
        # Other updates (a binding confirmed) give the loop nothing new to do.
        changed = _resized_or_rebounded(old, pod) or _ungated(old, pod)
        if kind == "ADDED" or pod.finished or pod.deleting or changed:
            self._wake(True)
        elif old is not None and old.phase != pod.phase and self._counted(pod):
            self._wake(False)

    def _resize_fits(self, pod: PodRequest) -> None:
        """Tell the user of a resize that cannot fit on its node (it is counted at its largest
        size meanwhile, so nothing else is placed into the room it asks for)."""
        assert pod.node is not None
        over = self._cache.overcommitted(pod.node)
        if over is None or self._resize_blocked is None:
            return
        short = []
        if over.cpu_milli > 0:
            short.append(f"{over.cpu_milli}m CPU")
        if over.memory > 0:
            short.append(f"{over.memory} bytes of memory")
        if not short:
            return
        self._resize_blocked(
            pod,
            f"The resize of {pod.key} does not fit on node {pod.node}: its pods would need "
            f"{' and '.join(short)} more than it has. Until room frees there or the resize is "
            "lowered, the kubelet keeps it pending (condition PodResizePending); Shoal counts "
            "the pod at its larger size meanwhile, so nothing else takes that room.",
        )

    # -- nodes -----------------------------------------------------------------------------------
    def _nodes_listed(self, items: list[dict[str, Any]]) -> None:
        fresh = [self._node(item) for item in items]
        alive = {node.name for node in fresh}
        self._node_problems = {k: v for k, v in self._node_problems.items() if k in alive}
        self._cache.replace_nodes(fresh)
        self._wake(True)

    def _node_event(self, kind: str, raw: dict[str, Any]) -> None:
        if kind == "DELETED":
            name = (raw.get("metadata") or {}).get("name", "")
            self._node_problems.pop(str(name), None)
            self._cache.remove_node(NodeName(str(name)))
            self._wake(False)
            return
        self._cache.set_node(self._node(raw))
        self._wake(True)

    def _node(self, raw: dict[str, Any]) -> Node:
        problems: list[str] = []
        node = convert.node(raw, problems)
        text = "; ".join(problems)
        if self._node_problems.get(node.name, "") != text:
            self._node_problems[node.name] = text
            if text:
                log.warning("node_annotation_ignored", node=node.name, reason=text)
        return node

    def _counted(self, pod: PodRequest) -> bool:
        """Whether ``pod`` counts in the status of a PodGroup it names."""
        return any(k.status_from_members and k.named(pod) for k in self._kinds)


#: Pod annotations that set a gang's bounds: a change is a stage change of a running job.
_BOUNDS = (names.MIN_MEMBER_ANNOTATION, names.MAX_MEMBER_ANNOTATION)


def _resized_or_rebounded(old: PodRequest | None, new: PodRequest) -> bool:
    """``new`` asks for other bounds of its gang, or is counted for other resources (a resize
    requested, allocated or applied), than ``old``."""
    if old is None:
        return False
    if old.requests != new.requests:
        return True
    return any(old.annotations.get(a) != new.annotations.get(a) for a in _BOUNDS)


def _ungated(old: PodRequest | None, new: PodRequest) -> bool:
    """``new`` may be scheduled now and ``old`` might not (its last scheduling gate is gone)."""
    return old is not None and old.gated and not new.gated
