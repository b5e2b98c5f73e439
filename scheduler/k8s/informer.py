"""List/watch of one resource kind, on a thread, as raw JSON, with the loop both programs share
(:mod:`common.listwatch`).

The loop (as kopf and client-go do it): list (in pages) and hand the whole set to ``on_list``;
watch from the list's resourceVersion with bookmarks, handing each change to ``on_event`` and
remembering the newest resourceVersion; when a watch ends, watch again from there; on
``410 Gone`` (the version was compacted away) list again. Any other failure is logged and retried
after a capped backoff, so a flaky API server never kills the scheduler. A kind the API server
does not serve (``missing_ok``: a CRD not installed) is an empty set, asked for again now and
then.

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
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import structlog
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from common import listwatch
from common.listwatch import Gone

log = structlog.get_logger("scheduler.informer")

Lister = Callable[..., Any]  # a generated list_* method of the official client


#: Seconds a watch may stay silent beyond its server-side timeout before the client gives up.
WATCH_MARGIN = 30

__all__ = ["WATCH_MARGIN", "Gone", "Handlers", "Informer", "Lister"]


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
        self._policy = listwatch.Policy(
            watch_timeout=watch_timeout, retry_after=0.5, max_backoff=max_backoff
        )
        self._request_timeout = request_timeout
        self._kwargs = dict(list_kwargs or {})
        self._missing_ok = missing_ok
        self.synced = threading.Event()
        self._cursor = listwatch.Cursor()
        self._stop = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name=f"informer-{kind}", daemon=True)

    @property
    def resource_version(self) -> str:
        """The newest version seen (a list's, a change's or a bookmark's), to watch from."""
        return self._cursor.version

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
        hooks = listwatch.Hooks(expired=self._expired, failed=self._failed, absent=self._absent)
        listwatch.run_blocking(
            listwatch.steps(self._cursor, self._policy, hooks),
            self._cursor,
            relist=self._list,
            watch=self._watch,
            changed=self._event,
            stop=self._stop,
        )

    def _expired(self, _exc: Exception) -> None:
        log.info("watch_expired_relisting", kind=self.kind, rv=self.resource_version)

    def _failed(self, exc: Exception) -> None:
        status = exc.status if isinstance(exc, ApiException) else None
        log.warning("informer_error", kind=self.kind, error=str(exc)[:300], status=status)

    def _absent(self, exc: Exception) -> bool:
        """The resource kind is not installed (a CRD): an empty set, checked again later."""
        if not (self._missing_ok and isinstance(exc, ApiException) and exc.status == 404):
            return False
        if not self.synced.is_set():
            self._handlers.on_list([])
            self.synced.set()
            log.info("resource_not_installed", kind=self.kind)
        return True

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
                version = str(meta.get("resourceVersion", ""))
                break
        self._handlers.on_list(items)
        self._cursor.listed(version, time.monotonic())
        self.synced.set()
        log.info("informer_listed", kind=self.kind, items=len(items), rv=self.resource_version)

    def _watch(self, version: str, timeout: int) -> Iterator[listwatch.WatchEvent]:
        try:
            response = self._lister(
                watch=True,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout,
                _preload_content=False,
                # (connect, read): a read waits at most as long as the server keeps a watch open.
                _request_timeout=(self._request_timeout, timeout + WATCH_MARGIN),
                **self._kwargs,
            )
        except ApiException as exc:
            if exc.status == 410:
                raise Gone(str(exc)[:300]) from exc
            raise
        self._response = response
        try:
            for line in iter_resp_lines(response):
                if line:
                    yield listwatch.decode(line)
        finally:
            self._response = None
            response.release_conn()

    def _event(self, event: listwatch.WatchEvent) -> None:
        if event.type != "BOOKMARK":
            self._handlers.on_event(event.type, event.object)
