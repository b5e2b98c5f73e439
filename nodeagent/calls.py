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
from typing import Any, Protocol, TypeVar

from nodeagent.events import Notice, Pod, Tracked

T = TypeVar("T")


class ClusterPort(Protocol):
    """The Kubernetes calls the agent makes (see :class:`nodeagent.k8s.Cluster`); blocking."""

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


class WatchExpired(Exception):
    """The version a watch started from is too old (HTTP 410 Gone): list again."""


@dataclass(frozen=True, slots=True)
class PodChange:
    """One change a pod watch saw: ``pod`` added or changed, or ``gone`` (deleted, or finished:
    a pod list leaves out pods that succeeded or failed); ``pod`` is None for a bookmark. Each
    carries the watch's ``version`` to resume from."""

    pod: Pod | None
    gone: bool
    version: str


class PodFeed(Protocol):
    """This node's pods, listed then watched (see :class:`nodeagent.k8s.Cluster`); blocking."""

    def list_pods_at(self) -> tuple[list[Pod], str]:
        """The pods and the version of the list (to watch from)."""

    def watch_pods(self, version: str, timeout: int) -> Iterator[PodChange]:
        """Each change after ``version`` until the server ends the watch (after ``timeout``
        seconds) or :meth:`stop_watch`; raises :class:`WatchExpired` when ``version`` is too
        old, another exception when the API server cannot be reached or the watch breaks."""

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
        return await asyncio.wait_for(loop.run_in_executor(pool, call, *args), self.timeout)

    def close(self) -> None:
        """Take no more calls. Threads blocked on an unreachable API server end on the
        transport's timeout; calls still queued are dropped."""
        self._writes.shutdown(wait=False, cancel_futures=True)
        self._reads.shutdown(wait=False, cancel_futures=True)
