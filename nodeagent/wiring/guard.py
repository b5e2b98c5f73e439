"""Guarded background tasks: a task that crashes or ends is logged and started again a second
later, never lost. Each runs until cancelled::

    running --crash or end (logged, counted)--> waiting 1 s --> running
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

log = structlog.get_logger("nodeagent")

#: Seconds between a task's crash and its restart.
RESTART_AFTER = 1.0


class Guard:
    """The agent's background tasks, by name; ``/healthz`` fails while one is dead."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._crashes: dict[str, int] = {}

    def run(self, name: str, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work`` as the task ``name``, restarted whenever it crashes or ends."""

        async def guarded() -> None:
            while True:
                try:
                    await work()
                    log.error("task_ended", task=name)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("task_crashed", task=name)
                self._crashes[name] = self._crashes.get(name, 0) + 1
                await asyncio.sleep(RESTART_AFTER)

        self._tasks[name] = asyncio.create_task(guarded(), name=f"nodeagent-{name}")

    def dead(self) -> list[str]:
        """Tasks no longer running (the guard itself failed, or they were cancelled)."""
        return [name for name, task in self._tasks.items() if task.done()]

    @property
    def crashes(self) -> dict[str, int]:
        """How many times each task crashed or ended (a copy)."""
        return dict(self._crashes)

    async def stop(self) -> None:
        running = list(self._tasks.values())
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
