"""A scripted stand-in for a list-then-watch feed (:class:`nodeagent.core.ports.Feed`): lists
answer
what the test put in ``listed``; each watch plays the steps the test queues until one ends it."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from nodeagent.core.ports import Change

T = TypeVar("T")

#: What a scripted watch does next: hand a change, end (the server's timeout), or raise.
Step = Change[T] | str | Exception


class Scripted(Generic[T]):
    """Lists answer ``listed`` (or raise ``list_error``); each watch plays steps from
    ``steps`` until one ends it."""

    def __init__(self, listed: list[T], version: str = "10") -> None:
        self.listed = listed
        self.version = version
        self.list_error: Exception | None = None
        self.lists = 0
        self.watched_from: list[str] = []
        self.steps: queue.Queue[Step[T]] = queue.Queue()
        self._stopped = threading.Event()

    def list_at(self) -> tuple[list[T], str]:
        self.lists += 1
        if self.list_error is not None:
            raise self.list_error
        return list(self.listed), self.version

    def watch(self, version: str, timeout: int) -> Iterator[Change[T]]:
        self.watched_from.append(version)
        while not self._stopped.is_set():
            try:
                step = self.steps.get(timeout=0.05)
            except queue.Empty:
                continue
            if isinstance(step, Exception):
                raise step
            if isinstance(step, str):
                return
            yield step

    def stop_watch(self) -> None:
        self._stopped.set()


async def until(probe: Callable[[], object]) -> None:
    for _ in range(1000):
        if probe():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not reached within 10 s")
