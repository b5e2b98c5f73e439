"""Informers for the PodGroup kinds beyond scheduler-plugins' (Volcano's, Kubernetes' own),
and for PriorityClasses, whose values a Volcano PodGroup's ``spec.priorityClassName`` stands for.

A kind the API server does not serve (no Volcano CRDs, workloads not enabled) is an empty set,
logged once at info; its informer asks again now and then, so CRDs installed later are picked
up without a restart. Kubernetes' PodGroup is read in the newest version served (v1beta1, else
v1alpha3), found when it is first listed.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from scheduler.cache import Cache
from scheduler.k8s import convert
from scheduler.k8s.group_status import KUBERNETES_VERSIONS, VERSIONS
from scheduler.k8s.informer import Handlers, Informer
from scheduler.model import GroupApi, group_ref

Wake = Callable[[bool], None]


class GroupView:
    def __init__(self, api: Any, cache: Cache, wake: Wake, *, page_size: int = 500) -> None:
        self._cache = cache
        self._wake = wake
        self._lock = threading.Lock()
        self._priorities: dict[str, int] = {}
        # Volcano PodGroups as read, so that a PriorityClass that appears later is applied.
        self._volcano: dict[str, dict[str, Any]] = {}
        custom = client.CustomObjectsApi(api)
        volcano = GroupApi.VOLCANO
        self.informers = [
            Informer(
                "priorityclasses",
                client.SchedulingV1Api(api).list_priority_class,
                Handlers(self._classes_listed, self._class_event),
                page_size=page_size,
            ),
            Informer(
                "volcano-podgroups",
                functools.partial(
                    custom.list_cluster_custom_object, volcano.value, VERSIONS[volcano], "podgroups"
                ),
                Handlers(self._volcano_listed, self._volcano_event),
                page_size=page_size,
                missing_ok=True,
            ),
            Informer(
                "kubernetes-podgroups",
                _NewestServed(custom),
                Handlers(self._kubernetes_listed, self._kubernetes_event),
                page_size=page_size,
                missing_ok=True,
            ),
        ]

    # -- priority classes ------------------------------------------------------------------------
    def _classes_listed(self, items: list[dict[str, Any]]) -> None:
        with self._lock:
            self._priorities = {_name(i): int(i.get("value") or 0) for i in items}
        self._reconvert(None)

    def _class_event(self, kind: str, raw: dict[str, Any]) -> None:
        name = _name(raw)
        with self._lock:
            if kind == "DELETED":
                self._priorities.pop(name, None)
            else:
                self._priorities[name] = int(raw.get("value") or 0)
        self._reconvert(name)

    def _reconvert(self, klass: str | None) -> None:
        """Read again the Volcano PodGroups of PriorityClass ``klass`` (``None``: all)."""
        with self._lock:
            raws = [
                r
                for r in self._volcano.values()
                if klass is None or (r.get("spec") or {}).get("priorityClassName") == klass
            ]
            priorities = dict(self._priorities)
        for raw in raws:
            self._cache.set_pod_group(convert.volcano_pod_group(raw, priorities))
        if raws:
            self._wake(True)

    # -- Volcano PodGroups -----------------------------------------------------------------------
    def _volcano_listed(self, items: list[dict[str, Any]]) -> None:
        with self._lock:
            self._volcano = {_ref(i): i for i in items}
            priorities = dict(self._priorities)
        groups = [convert.volcano_pod_group(i, priorities) for i in items]
        self._cache.replace_pod_groups(groups, GroupApi.VOLCANO)
        self._wake(True)

    def _volcano_event(self, kind: str, raw: dict[str, Any]) -> None:
        ref = _ref(raw)
        with self._lock:
            if kind == "DELETED":
                self._volcano.pop(ref, None)
            else:
                self._volcano[ref] = raw
            priorities = dict(self._priorities)
        if kind == "DELETED":
            self._cache.remove_pod_group(ref)
        else:
            self._cache.set_pod_group(convert.volcano_pod_group(raw, priorities))
        self._wake(True)

    # -- Kubernetes PodGroups --------------------------------------------------------------------
    def _kubernetes_listed(self, items: list[dict[str, Any]]) -> None:
        groups = [convert.kubernetes_pod_group(i) for i in items]
        self._cache.replace_pod_groups(groups, GroupApi.KUBERNETES)
        self._wake(True)

    def _kubernetes_event(self, kind: str, raw: dict[str, Any]) -> None:
        group = convert.kubernetes_pod_group(raw)
        if kind == "DELETED":
            self._cache.remove_pod_group(group.ref)
        else:
            self._cache.set_pod_group(group)
        self._wake(True)


class _NewestServed:
    """A lister of ``scheduling.k8s.io`` PodGroups in the newest version the API server
    serves, found by asking each (newest first) until one answers; 404 when none does."""

    def __init__(self, custom: Any) -> None:
        self._custom = custom
        self._version: str | None = None

    def __call__(self, **kwargs: Any) -> Any:
        if self._version is None:
            self._version = self._find(kwargs.get("_request_timeout"))
            VERSIONS[GroupApi.KUBERNETES] = self._version
        return self._custom.list_cluster_custom_object(
            GroupApi.KUBERNETES.value, self._version, "podgroups", **kwargs
        )

    def _find(self, timeout: Any) -> str:
        missing: ApiException | None = None
        for version in KUBERNETES_VERSIONS:
            try:
                self._custom.list_cluster_custom_object(
                    GroupApi.KUBERNETES.value,
                    version,
                    "podgroups",
                    limit=1,
                    _preload_content=False,
                    _request_timeout=timeout,
                ).release_conn()
            except ApiException as exc:
                if exc.status != 404:
                    raise
                missing = exc
                continue
            return version
        raise missing or ApiException(status=404, reason="no PodGroup version served")


def _name(raw: dict[str, Any]) -> str:
    return str((raw.get("metadata") or {}).get("name", ""))


def _ref(raw: dict[str, Any]) -> str:
    meta = raw.get("metadata") or {}
    return group_ref(GroupApi.VOLCANO, str(meta.get("namespace", "")), str(meta.get("name", "")))
