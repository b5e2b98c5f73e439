"""List, then watch: how the agent follows what it reads from the API server (its pods, its own
Node, the Events of the reasons it is told to heed), as client-go's reflectors do.

A :class:`Follower` lists (its owner's ``relist``, which applies the whole list and hands the
list's version to :meth:`Follower.listed`), then watches from that version, each change handed
over as it comes. A watch the server ends (after ``watch_timeout`` to twice that, at random, so
that a fleet's agents do not come back in step) is opened again from the newest version it saw,
after listing again once ``relist_every`` has passed (a slow safety net); ``410 Gone`` lists
again at once; any other failure (an API server restarting, a broken connection) is logged and
retried after a backoff from ``retry_after`` doubling up to ``max_backoff`` (each wait drawn
between half and all of it), resuming where it broke. So nothing is lost while no watch is
open: the watch from the old version replays what changed meanwhile, or, when that version is
too old, the list shows where things stand.

Each watch reads on a daemon thread of its own (a blocked read never holds up the exit) with a
client-side read timeout past the server's (the feed's, :mod:`nodeagent.k8s.cluster`); its
changes, then its end, are handed to the event loop in order. The idle cost is one watch request
per feed every ``watch_timeout`` to twice that, and one list per ``relist_every``
(docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import structlog

from nodeagent.calls import Change, Feed, WatchExpired

log = structlog.get_logger("nodeagent")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class WatchSettings:
    #: Each watch lasts this long to twice this long (seconds, ended by the server).
    watch_timeout: int = 300
    #: A watch that ends is preceded by a list once this long has passed since the last one.
    relist_every: float = 1800.0
    #: After a failed list or watch, retry this long later, doubling up to ``max_backoff``: kept
    #: short, since a broken watch is how an API server restart shows, and the watch should be
    #: back within a second or two of the API server.
    retry_after: float = 0.25
    max_backoff: float = 1.0


class Follower(Generic[T]):
    """Follows one feed (:meth:`run`) until stopped; ``what`` names it in logs and threads."""

    def __init__(
        self,
        what: str,
        feed: Feed[T],
        *,
        relist: Callable[[], Awaitable[None]],
        changed: Callable[[Change[T]], None],
        settings: WatchSettings | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.what = what
        self._feed = feed
        self._relist = relist
        self._changed = changed
        self._settings = settings or WatchSettings()
        self._rng = rng or random.Random()  # noqa: S311 (jitter, not secrets)
        #: The newest version seen (a list's or a change's), to watch from.
        self.version = ""
        #: A watch is open now.
        self.watching = False
        #: Why the last list or watch failed, until a list or a watch is answered again.
        self.error: str | None = None
        self._listed_at = -float("inf")
        self._stopping = False

    def listed(self, version: str) -> None:
        """A whole list at ``version`` was applied: the next watch starts from it."""
        self.version = version
        self._listed_at = time.monotonic()
        self.error = None

    async def run(self) -> None:
        """List, then watch; never returns."""
        s = self._settings
        backoff = s.retry_after
        relist = False
        while True:
            try:
                if relist or time.monotonic() - self._listed_at >= s.relist_every:
                    await self._relist()
                    relist = False
                self.watching = True
                await self._watch()
                backoff, self.error = s.retry_after, None
            except WatchExpired as exc:
                log.info(
                    f"{self.what}_watch_expired_relisting", version=self.version, detail=str(exc)
                )
                relist = True
            except Exception as exc:
                self.error = str(exc) or type(exc).__name__
                log.warning(f"{self.what}_watch_failed", error=self.error)
                await asyncio.sleep(backoff * self._rng.uniform(0.5, 1.0))
                backoff = min(backoff * 2, s.max_backoff)
            finally:
                self.watching = False

    async def _watch(self) -> None:
        """One watch from the newest version, until it ends; each change handed over as it
        comes."""
        timeout = round(self._settings.watch_timeout * self._rng.uniform(1.0, 2.0))
        watch = _WatchThread(asyncio.get_running_loop(), self._change, lambda: self._stopping)
        try:
            await watch.run(self._feed, self.version, timeout, f"nodeagent-{self.what}-watch")
        except asyncio.CancelledError:
            self._feed.stop_watch()
            raise

    def _change(self, change: Change[T]) -> None:
        if change.version:
            self.version = change.version
        self.error = None
        if change.item is not None:
            self._changed(change)

    def stop(self) -> None:
        """End the watch under way; changes still on their way are dropped."""
        self._stopping = True
        self._feed.stop_watch()


class Mirror(Generic[T]):
    """The objects of one feed as last listed and watched, by ``key`` (an informer's store);
    ``changed`` is called after each list and each change. Lists run on a thread of their own
    (the transport's time limit ends them)."""

    def __init__(
        self,
        what: str,
        feed: Feed[T],
        *,
        key: Callable[[T], str],
        changed: Callable[[], None],
        settings: WatchSettings | None = None,
    ) -> None:
        self._feed = feed
        self._key = key
        self._changed = changed
        self.items: dict[str, T] = {}
        self.follower = Follower(
            what, feed, relist=self._relist, changed=self._change, settings=settings
        )

    async def _relist(self) -> None:
        items, version = await asyncio.to_thread(self._feed.list_at)
        self.items = {self._key(item): item for item in items}
        self.follower.listed(version)
        self._changed()

    def _change(self, change: Change[T]) -> None:
        if change.item is None:
            return
        key = self._key(change.item)
        if change.gone:
            self.items.pop(key, None)
        else:
            self.items[key] = change.item
        self._changed()


class _WatchThread(Generic[T]):
    """One watch, read on a daemon thread of its own; its changes, then its end, are handed to
    the event loop in order."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        changed: Callable[[Change[T]], None],
        stopping: Callable[[], bool],
    ) -> None:
        self._loop = loop
        self._changed = changed
        self._stopping = stopping
        self._ended: asyncio.Future[None] = loop.create_future()

    async def run(self, feed: Feed[T], version: str, seconds: int, name: str) -> None:
        thread = threading.Thread(target=self._follow, args=(feed, version, seconds), name=name)
        thread.daemon = True
        thread.start()
        await self._ended

    def _hand(self, call: Callable[[Any], None], arg: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: the agent stopped
            self._loop.call_soon_threadsafe(call, arg)

    def _end(self, error: BaseException | None) -> None:
        if self._ended.done():
            return
        if error is None:
            self._ended.set_result(None)
        else:
            self._ended.set_exception(error)

    def _follow(self, feed: Feed[T], version: str, timeout: int) -> None:
        try:
            for change in feed.watch(version, timeout):
                if self._stopping():
                    break
                self._hand(self._changed, change)
        except Exception as exc:
            self._hand(self._end, exc)
        else:
            self._hand(self._end, None)
