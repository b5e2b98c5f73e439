"""Optional webhook: a JSON POST when a notice arrives and again when the node has drained.

Sent in the background (a slow receiver never delays the workers' notices), retried three times
with backoff, failures logged and counted; never raises into the agent.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import structlog

from nodeagent.core.events import Notice, rfc3339

log = structlog.get_logger("nodeagent.adapters.webhook")


def payload(kind: str, node: str, notice: Notice) -> dict[str, Any]:
    """The message for ``kind`` (``notice``: a disruptive notice arrived, ``drained``: every
    pod it concerns is out)."""
    return {
        "kind": kind,
        "node": node,
        "event_id": notice.event_id,
        "source": notice.source,
        "notice_kind": notice.kind.value,
        "deadline": rfc3339(notice.deadline),
        "reason": notice.reason,
    }


class Webhook:
    def __init__(self, url: str, *, attempts: int = 3, time_limit: float = 5.0) -> None:
        self.url = url
        self.attempts = attempts
        self.time_limit = time_limit
        self.sent = 0
        self.failed = 0
        self._tasks: set[asyncio.Task[None]] = set()

    def send(self, payload: dict[str, Any]) -> None:
        task = asyncio.create_task(self._deliver(payload))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(self, payload: dict[str, Any]) -> None:
        timeout = aiohttp.ClientTimeout(total=self.time_limit)
        for attempt in range(1, self.attempts + 1):
            try:
                async with (
                    aiohttp.ClientSession(timeout=timeout) as session,
                    session.post(self.url, json=payload) as resp,
                ):
                    if resp.status < 300:
                        self.sent += 1
                        return
                    error = f"HTTP {resp.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                error = f"{exc.__class__.__name__}: {exc}"
            log.warning("webhook_failed", attempt=attempt, error=error, kind=payload.get("kind"))
            await asyncio.sleep(0.5 * 2**attempt)
        self.failed += 1

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
