"""The Kubernetes calls the agent makes, and where they run: off the event loop.

The official client blocks, and the API server may not answer exactly when notices matter. Each
call runs on a thread pool and is given up after a time limit (the thread itself ends on the
transport's own timeout; a call still queued is dropped), so the event loop — the workers'
notices, their acknowledgements, ``/healthz`` — never waits on the API server. Writes share a
few threads; reads (the pod list, the node annotation) have a thread of their own, so a backlog
of writes never holds up a list.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from common.listwatch import Gone
from nodeagent.core.events import Notice, Pod, Tracked

T = TypeVar("T")


class ClusterPort(Protocol):
    """The Kubernetes calls the agent makes (see :class:`nodeagent.adapters.k8s.Cluster`);
    blocking."""

    last_ok: float
    dry_run: bool

    def read_revocation(self) -> list[Tracked]: ...
    def list_pods(self) -> list[Pod]: ...
    def sync_node(self, tracked: Sequence[Tracked]) -> None: ...
    def annotate_pod(self, pod: Pod, notice: Notice) -> bool: ...
    def clear_pod(self, pod: Pod) -> bool: ...
    def warn_pod(self, pod: Pod, reason: str, message: str) -> None: ...
    def evict(self, pod: Pod, reason: str) -> bool: ...
    def delete(self, pod: Pod, grace_seconds: int) -> bool: ...
    def write_topology(self, text: str) -> None: ...


#: The version a watch started from is too old (HTTP 410 Gone): list again (the shared loop's
#: :class:`common.listwatch.Gone`).
WatchExpired = Gone


@dataclass(frozen=True, slots=True)
class Change(Generic[T]):
    """One change a watch saw: ``item`` added or changed, or ``gone`` (deleted; for a pod also
    finished, since a pod list leaves out pods that succeeded or failed); ``item`` is None for a
    bookmark. Each carries the watch's ``version`` to resume from."""

    item: T | None
    gone: bool
    version: str


#: A change to one of this node's pods (for annotations: a slotted generic alias cannot be called).
PodChange = Change[Pod]


class Feed(Protocol[T]):
    """Objects of one kind, listed then watched through a field selector (this node's pods, the
    Node itself, the Events of a reason; see :mod:`nodeagent.adapters.k8s.cluster`); blocking."""

    def list_at(self) -> tuple[list[T], str]:
        """The objects and the version of the list (to watch from)."""

    def watch(self, version: str, timeout: int) -> Iterator[Change[T]]:
        """Each change after ``version`` until the server ends the watch (after ``timeout``
        seconds) or :meth:`stop_watch`, after an empty change (no item, no version) once the
        server has answered; raises :class:`WatchExpired` when ``version`` is too old, another
        exception when the API server cannot be reached or the watch breaks."""

    def stop_watch(self) -> None:
        """End the watch under way, from another thread."""


class ApiCalls:
    """Blocking calls run on the API threads: at most ``concurrency`` writes at once, one read,
    each given up after ``timeout`` seconds (raising :class:`TimeoutError`)."""

    def __init__(self, *, timeout: float, concurrency: int) -> None:
        self.timeout = timeout
        self._writes = ThreadPoolExecutor(concurrency, thread_name_prefix="nodeagent-api")
        self._reads = ThreadPoolExecutor(1, thread_name_prefix="nodeagent-api-read")

    async def read(self, call: Callable[..., T], *args: Any) -> T:
        return await self._run(self._reads, call, args)

    async def write(self, call: Callable[..., T], *args: Any) -> T:
        return await self._run(self._writes, call, args)

    async def _run(
        self, pool: ThreadPoolExecutor, call: Callable[..., T], args: Sequence[Any]
    ) -> T:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.timeout):
            return await loop.run_in_executor(pool, call, *args)

    def close(self) -> None:
        """Take no more calls. Threads blocked on an unreachable API server end on the
        transport's timeout; calls still queued are dropped."""
        self._writes.shutdown(wait=False, cancel_futures=True)
        self._reads.shutdown(wait=False, cancel_futures=True)
