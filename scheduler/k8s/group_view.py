"""Informers for every PodGroup kind in the table (:data:`scheduler.gang.kinds.KINDS`), and for
PriorityClasses, whose values a PodGroup's ``spec.priorityClassName`` may stand for.

Each kind is read in the newest of its versions the API server serves, found when it is first
listed and held by its lister (:meth:`GroupView.served`: status writes and Events use it). A kind
the API server does not serve (no Volcano CRDs, workloads not enabled) is an empty set, logged
once at info; its informer asks again now and then, so CRDs installed later are picked up
without a restart.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from scheduler.cache import Cache
from scheduler.gang.kinds import KINDS, Api, Kinds, PodGroupKind
from scheduler.k8s.informer import Handlers, Informer
from scheduler.model import PodGroup

Wake = Callable[[bool], None]


class GroupView:
    def __init__(
        self, api: Any, cache: Cache, wake: Wake, *, page_size: int = 500, kinds: Kinds = KINDS
    ) -> None:
        self._wake = wake
        self._lock = threading.Lock()
        self._priorities: dict[str, int] = {}
        custom = client.CustomObjectsApi(api)
        self._feeds = {k.tag: _Feed(k, _NewestServed(custom, k.api), cache, self) for k in kinds}
        self.informers = [
            Informer(
                "priorityclasses",
                client.SchedulingV1Api(api).list_priority_class,
                Handlers(self._classes_listed, self._class_event),
                page_size=page_size,
            ),
            *(
                Informer(
                    feed.kind.api.resource,
                    feed.lister,
                    Handlers(feed.listed, feed.event),
                    page_size=page_size,
                    missing_ok=True,
                )
                for feed in self._feeds.values()
            ),
        ]

    def served(self, kind: PodGroupKind) -> str:
        """The version of ``kind`` read and written: the newest served, once found."""
        return self._feeds[kind.tag].lister.version or kind.api.versions[0]

    def priorities(self) -> dict[str, int]:
        with self._lock:
            return dict(self._priorities)

    def wake(self) -> None:
        self._wake(True)

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
        """Read again the PodGroups of PriorityClass ``klass`` (``None``: all)."""
        priorities = self.priorities()
        if any([feed.reconvert(klass, priorities) for feed in self._feeds.values()]):
            self._wake(True)


class _Feed:
    """One kind's informer handlers: each object read into the cache; the objects of a kind
    that reads PriorityClasses kept as read, so that a class that changes is applied."""

    def __init__(self, kind: PodGroupKind, lister: _NewestServed, cache: Cache, view: GroupView):
        self.kind = kind
        self.lister = lister
        self._cache = cache
        self._view = view
        self._lock = threading.Lock()
        self._raws: dict[str, dict[str, Any]] = {}

    def _read(self, raw: dict[str, Any]) -> PodGroup:
        return self.kind.convert(raw, self._view.priorities())

    def listed(self, items: list[dict[str, Any]]) -> None:
        groups = [self._read(i) for i in items]
        if self.kind.uses_priorities:
            with self._lock:
                self._raws = {g.ref: i for g, i in zip(groups, items, strict=True)}
        self._cache.replace_pod_groups(groups, self.kind.tag)
        self._view.wake()

    def event(self, kind: str, raw: dict[str, Any]) -> None:
        group = self._read(raw)
        if self.kind.uses_priorities:
            with self._lock:
                if kind == "DELETED":
                    self._raws.pop(group.ref, None)
                else:
                    self._raws[group.ref] = raw
        if kind == "DELETED":
            self._cache.remove_pod_group(group.ref)
        else:
            self._cache.set_pod_group(group)
        self._view.wake()

    def reconvert(self, klass: str | None, priorities: dict[str, int]) -> bool:
        """Read again this kind's PodGroups of PriorityClass ``klass`` (``None``: all); whether
        there were any."""
        with self._lock:
            raws = list(self._raws.values())
        groups = [self.kind.convert(r, priorities) for r in raws]
        changed = [g for g in groups if klass is None or g.priority_class == klass]
        for group in changed:
            self._cache.set_pod_group(group)
        return bool(changed)


class _NewestServed:
    """A lister of one kind's objects in the newest version the API server serves, found by
    asking each (newest first) until one answers; 404 when none does. A kind with one version
    is not asked: its informer's own list says whether it is served."""

    def __init__(self, custom: Any, api: Api) -> None:
        self._custom = custom
        self._api = api
        #: The version found (``None`` until then).
        self.version: str | None = api.versions[0] if len(api.versions) == 1 else None

    def __call__(self, **kwargs: Any) -> Any:
        if self.version is None:
            self.version = self._find(kwargs.get("_request_timeout"))
        return self._custom.list_cluster_custom_object(
            self._api.group, self.version, self._api.plural, **kwargs
        )

    def _find(self, timeout: Any) -> str:
        missing: ApiException | None = None
        for version in self._api.versions:
            try:
                self._custom.list_cluster_custom_object(
                    self._api.group,
                    version,
                    self._api.plural,
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
        raise missing or ApiException(status=404, reason=f"no {self._api.resource} version served")


def _name(raw: dict[str, Any]) -> str:
    return str((raw.get("metadata") or {}).get("name", ""))
