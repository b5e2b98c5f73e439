"""List/watch of one resource kind, on a thread, as raw JSON.

The loop (as kopf and client-go do it): list (in pages) and hand the whole set to ``on_list``;
watch from the list's resourceVersion with bookmarks, handing each change to ``on_event`` and
remembering the newest resourceVersion; when a watch ends, watch again from there; on
``410 Gone`` (the version was compacted away) list again. Any other failure is logged and retried
after a capped backoff, so a flaky API server never kills the scheduler.

Every request has a client-side timeout: a connection that goes silent (a stalled load balancer,
a half-open TCP connection after a network partition) ends in an error and a retry, not in an
informer that waits forever while the cache goes stale. A watch is allowed its server-side
timeout plus a margin, so a healthy watch always ends on the server's side first.

Objects are decoded with ``json.loads`` rather than the generated models: the scheduler needs a
few fields of many objects, and raw dicts are several times faster to read.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import structlog
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

log = structlog.get_logger("scheduler.informer")

Lister = Callable[..., Any]  # a generated list_* method of the official client


#: Seconds a watch may stay silent beyond its server-side timeout before the client gives up.
WATCH_MARGIN = 30


class Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): list again."""


@dataclass(frozen=True, slots=True)
class Handlers:
    on_list: Callable[[list[dict[str, Any]]], None]
    on_event: Callable[[str, dict[str, Any]], None]


class Informer:
    def __init__(
        self,
        kind: str,
        lister: Lister,
        handlers: Handlers,
        *,
        page_size: int = 500,
        watch_timeout: int = 300,
        max_backoff: float = 10.0,
        request_timeout: float = 60.0,
        list_kwargs: dict[str, Any] | None = None,
        missing_ok: bool = False,
    ) -> None:
        self.kind = kind
        self._lister = lister
        self._handlers = handlers
        self._page_size = page_size
        self._watch_timeout = watch_timeout
        self._max_backoff = max_backoff
        self._request_timeout = request_timeout
        self._kwargs = dict(list_kwargs or {})
        self._missing_ok = missing_ok
        self.synced = threading.Event()
        self.resource_version = ""
        self._stop = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name=f"informer-{kind}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            try:
                # Shut the socket down first: close() alone can block while the informer's
                # thread is inside a read of the watch stream, and stall shutdown for good.
                response.shutdown()
                response.close()
            except Exception as exc:
                log.debug("informer_close_failed", kind=self.kind, error=str(exc))

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    # -- the loop --------------------------------------------------------------------------------
    def _run(self) -> None:
        backoff = 0.5
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list:
                    self._list()
                    need_list = False
                self._watch()
                backoff = 0.5
            except Gone:
                log.info("watch_expired_relisting", kind=self.kind, rv=self.resource_version)
                need_list = True
            except Exception as exc:
                if self._stop.is_set():
                    return
                status = exc.status if isinstance(exc, ApiException) else None
                if status == 404 and self._missing_ok:
                    # The resource kind is not installed (a CRD): an empty set, checked again.
                    if not self.synced.is_set():
                        self._handlers.on_list([])
                        self.synced.set()
                        log.info("resource_not_installed", kind=self.kind)
                    need_list = True
                    self._stop.wait(self._max_backoff)
                    continue
                log.warning("informer_error", kind=self.kind, error=str(exc)[:300], status=status)
                if status == 410:
                    need_list = True
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._max_backoff)

    def _list(self) -> None:
        items: list[dict[str, Any]] = []
        cont: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": self._page_size, **self._kwargs}
            if cont:
                kwargs["_continue"] = cont
            response = self._lister(
                _preload_content=False, _request_timeout=self._request_timeout, **kwargs
            )
            doc = json.loads(response.data)
            response.release_conn()
            items.extend(doc.get("items") or [])
            meta = doc.get("metadata") or {}
            cont = meta.get("continue")
            if not cont:
                self.resource_version = str(meta.get("resourceVersion", ""))
                break
        self._handlers.on_list(items)
        self.synced.set()
        log.info("informer_listed", kind=self.kind, items=len(items), rv=self.resource_version)

    def _watch(self) -> None:
        response = self._lister(
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._watch_timeout,
            _preload_content=False,
            # (connect, read): a read waits at most as long as the server keeps a watch open.
            _request_timeout=(self._request_timeout, self._watch_timeout + WATCH_MARGIN),
            **self._kwargs,
        )
        self._response = response
        try:
            for event in _events(response):
                if self._stop.is_set():
                    return
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone
                    raise RuntimeError(f"watch error: {obj.get('message', obj)}")
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if rv:
                    self.resource_version = str(rv)
                if kind == "BOOKMARK":
                    continue
                self._handlers.on_event(str(kind), obj)
        finally:
            self._response = None
            response.release_conn()


def _events(response: Any) -> Iterator[dict[str, Any]]:
    for line in iter_resp_lines(response):
        if line:
            yield json.loads(line)
