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
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from common.listwatch import Gone

T = TypeVar("T")


#: The version a watch started from is too old (HTTP 410 Gone): list again (the shared loop's
#: :class:`common.listwatch.Gone`).
WatchExpired = Gone


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
