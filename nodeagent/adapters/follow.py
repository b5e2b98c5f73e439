"""List, then watch: how the agent follows what it reads from the API server (its pods, its own
Node, the Events of the reasons it is told to heed), with the loop both programs share
(:mod:`common.listwatch`).

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
client-side read timeout past the server's (the feed's, :mod:`nodeagent.adapters.k8s.cluster`); its
changes, then its end, are handed to the event loop in order. The idle cost is one watch request
per feed every ``watch_timeout`` to twice that, and one list per ``relist_every``
(docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import structlog

from common import listwatch
from nodeagent.core.ports import Change, Feed

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

    def policy(self) -> listwatch.Policy:
        """The shared loop's policy: watches spread over one to two timeouts, waits drawn
        between half and all of the backoff."""
        return listwatch.Policy(
            watch_timeout=self.watch_timeout,
            watch_spread=2.0,
            relist_every=self.relist_every,
            retry_after=self.retry_after,
            max_backoff=self.max_backoff,
            jitter=0.5,
        )


class Follower(Generic[T]):
    """Follows one feed (:meth:`run`) until stopped, with the shared loop
    (:mod:`common.listwatch`); ``what`` names it in logs and threads."""

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
        self._cursor = listwatch.Cursor()
        self._watch = listwatch.AsyncWatch(
            feed.watch, feed.stop_watch, name=f"nodeagent-{what}-watch"
        )

    @property
    def version(self) -> str:
        """The newest version seen (a list's or a change's), to watch from."""
        return self._cursor.version

    @property
    def watching(self) -> bool:
        """A watch is open now."""
        return self._cursor.watching

    @property
    def error(self) -> str | None:
        """Why the last list or watch failed, until a list or a watch is answered again."""
        return self._cursor.error

    def listed(self, version: str) -> None:
        """A whole list at ``version`` was applied: the next watch starts from it."""
        self._cursor.listed(version, time.monotonic())

    async def run(self) -> None:
        """List, then watch; never returns."""
        hooks = listwatch.Hooks(expired=self._expired, failed=self._failed)
        steps = listwatch.steps(self._cursor, self._settings.policy(), hooks, rng=self._rng)
        await listwatch.run_async(
            steps, self._cursor, relist=self._relist, source=self._watch, changed=self._change
        )

    def _expired(self, exc: Exception) -> None:
        log.info(f"{self.what}_watch_expired_relisting", version=self.version, detail=str(exc))

    def _failed(self, _exc: Exception) -> None:
        log.warning(f"{self.what}_watch_failed", error=self.error)

    def _change(self, change: Change[T]) -> None:
        if change.item is not None:
            self._changed(change)

    def stop(self) -> None:
        """End the watch under way; changes still on their way are dropped."""
        self._watch.stop()


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
