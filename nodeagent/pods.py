"""This node's pods as the store knows them, and the state a started agent restores.

Where the store's pods came from (:attr:`PodList.origin`)::

    none --the pod file names pods (at start)--> disk --a pod list answered--> api
    none --a pod list answered--> api

Whether the state is restored (:attr:`PodList.restored`)::

    not restored --the node annotation read, then the pods listed--> restored

Until restored nothing is written, since a write could repeat or undo what the last agent did;
the restore is retried every ``retry_after`` until the API server answers.

Then, with a pod feed (:class:`~nodeagent.calls.PodFeed`, the API server's watch), the pods are
followed as client-go's informers do: watch from the list's version, each change applied as it
comes (a scheduler's reclaim reaches the workers within a second of being written); when a watch
ends, watch again from the newest version, after listing again once ``relist_every`` has passed
(a slow safety net); on ``410 Gone`` list again; any other failure is logged and retried after a
backoff capped at ``max_backoff``, the watch resuming where it broke, so nothing is lost. Without
a feed the list is refreshed every ``every`` seconds (``every_under_notice`` while a disruptive
notice is live).

Callers wanting a list at the same time (a worker naming a pod not listed yet) share one request;
while a watch follows the pods, such a list only adds the pods it did not know, since it may be
older than the watch's latest change (and never brings back a pod the watch saw go). Each change
is kept in the pod file, when there is one (:class:`nodeagent.podcache.PodCache`), for the next
agent to start from. Every change also gives the intake the scheduler's reclaims on this node's
pods (:func:`nodeagent.store.reclaim_notice`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import structlog

from nodeagent.calls import ApiCalls, ClusterPort, PodChange, PodFeed, WatchExpired
from nodeagent.events import Notice, Pod, PodUid
from nodeagent.podcache import PodCache
from nodeagent.store import Store, reclaim_notice

log = structlog.get_logger("nodeagent")


def _ignore(_notices: Sequence[Notice]) -> None:
    return None


class PodList:
    """Keeps the store's pods fresh (:meth:`run`); the board asks it for a list on demand."""

    def __init__(
        self,
        store: Store,
        cluster: ClusterPort,
        calls: ApiCalls,
        *,
        clock: Callable[[], datetime],
        wake: Callable[[], None],
        pod_file: PodCache | None = None,
        every: float = 5.0,
        every_under_notice: float = 1.0,
        retry_after: float = 1.0,
        feed: PodFeed | None = None,
        relist_every: float = 60.0,
        watch_timeout: int = 60,
        max_backoff: float = 10.0,
        reclaims: Callable[[Sequence[Notice]], None] = _ignore,
    ) -> None:
        self._store = store
        self._cluster = cluster
        self._calls = calls
        self._clock = clock
        self._wake = wake
        self._file = pod_file
        self._every = every
        self._every_under_notice = every_under_notice
        self._retry_after = retry_after
        self._feed = feed
        self._relist_every = relist_every
        self._watch_timeout = watch_timeout
        self._max_backoff = max_backoff
        self._reclaims = reclaims
        #: "none", "disk" (the pod file, before the API server answered a list) or "api".
        self.origin = "none"
        self.restored = False
        #: When a pod list was last asked for (monotonic).
        self.tried_at = 0.0
        #: A watch follows the pods now.
        self.watching = False
        self._listing: asyncio.Task[None] | None = None
        self._view: dict[PodUid, Pod] = {}
        #: Pods the watch saw go since the last whole list (a caller's list may be older).
        self._gone: set[PodUid] = set()
        self._version = ""
        self._listed_at = 0.0
        self._saving: asyncio.Task[None] | None = None
        self._unsaved = False
        self._stopping = False

    def load_file(self) -> None:
        """The pods the last agent kept, so workers are answered before the API server is."""
        if self._file is None or self.origin != "none":
            return
        pods = self._file.load()
        if pods:
            self._view = {p.uid: p for p in pods}
            self._publish(save=False)
            self.origin = "disk"
            log.warning("pods_restored_from_disk", pods=len(pods))

    async def refresh(self) -> None:
        """List the pods (callers at the same time share one request); raises when it fails."""
        if self._listing is None or self._listing.done():
            self._listing = asyncio.create_task(self._list(), name="nodeagent-list-pods")
            # Retrieved here in case every caller gave up waiting for it.
            self._listing.add_done_callback(lambda t: t.cancelled() or t.exception())
        await asyncio.shield(self._listing)

    async def _list(self, *, whole: bool = False) -> None:
        """One list. ``whole``: it replaces what is known (else, while a watch follows the
        pods, it only adds pods not known yet)."""
        self.tried_at = time.monotonic()
        if self._feed is None:
            pods, version = await self._calls.read(self._cluster.list_pods), ""
        else:
            pods, version = await self._calls.read(self._feed.list_pods_at)
        if whole or not self.watching:
            self._view = {p.uid: p for p in pods}
            self._version, self._listed_at = version, time.monotonic()
            self._gone.clear()
        else:
            added = [p for p in pods if p.uid not in self._view and p.uid not in self._gone]
            self._view.update((p.uid, p) for p in added)
        if self.origin != "api":
            log.info("pods_listed", pods=len(pods), before=self.origin)
            self.origin = "api"
        self._publish()

    def _publish(self, *, save: bool = True) -> None:
        """Hand the pods as now known to the store, and their reclaims to the intake."""
        pods = list(self._view.values())
        self._store.set_pods(pods)
        self._reclaims([n for n in map(reclaim_notice, pods) if n is not None])
        if save and self._file is not None:
            self._save()
        self._wake()

    def _save(self) -> None:
        """Keep the pods in the file, off the event loop; changes that come while a save is
        under way are saved together right after it."""
        self._unsaved = True
        if self._saving is None or self._saving.done():
            self._saving = asyncio.create_task(self._save_all(), name="nodeagent-save-pods")

    async def _save_all(self) -> None:
        while self._unsaved and self._file is not None:
            self._unsaved = False
            pods = list(self._view.values())
            try:
                await asyncio.to_thread(self._file.save, pods, self._clock())
            except Exception as exc:  # the file is a convenience: never stop on it
                log.warning("pod_file_not_saved", error=str(exc) or type(exc).__name__)

    async def restore(self) -> None:
        """What the node annotation recorded, then the pods."""
        tracked = await self._calls.read(self._cluster.read_revocation)
        self._store.restore(tracked)
        await self.refresh()
        self.restored = True
        if tracked:
            log.warning("notices_restored", event_ids=[t.notice.event_id for t in tracked])
        self._wake()

    async def run(self) -> None:
        """Restore, then keep the pods fresh; never returns."""
        while True:
            if await self._turn():
                break
            await asyncio.sleep(self._retry_after)
        if self._feed is not None:
            await self._follow(self._feed)
        while True:
            live = any(t.notice.disruptive for t in self._store.active())
            await asyncio.sleep(self._every_under_notice if live else self._every)
            await self._turn()

    async def _turn(self) -> bool:
        """Restore or refresh; False when the restore failed (it is retried soon)."""
        restoring = not self.restored
        try:
            await (self.restore() if restoring else self.refresh())
        except Exception as exc:
            event = "restore_failed" if restoring else "pods_unreadable"
            log.warning(event, error=str(exc) or type(exc).__name__)
            return not restoring
        return True

    # --- the watch -------------------------------------------------------------------------------

    async def _follow(self, feed: PodFeed) -> None:
        """List, then watch; never returns."""
        backoff = self._retry_after
        relist = False
        while True:
            try:
                if relist or time.monotonic() - self._listed_at >= self._relist_every:
                    await self._list(whole=True)
                    relist = False
                self.watching = True
                await self._watch(feed)
                backoff = self._retry_after
            except WatchExpired as exc:
                log.info("pod_watch_expired_relisting", version=self._version, detail=str(exc))
                relist = True
            except Exception as exc:
                log.warning("pod_watch_failed", error=str(exc) or type(exc).__name__)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)
            finally:
                self.watching = False

    async def _watch(self, feed: PodFeed) -> None:
        """One watch from the newest version, until it ends; each change applied as it comes."""
        watch = _WatchThread(asyncio.get_running_loop(), self._changed, lambda: self._stopping)
        try:
            await watch.run(feed, self._version, self._watch_timeout)
        except asyncio.CancelledError:
            feed.stop_watch()
            raise

    def _changed(self, change: PodChange) -> None:
        if change.version:
            self._version = change.version
        pod = change.pod
        if pod is None:
            return
        if change.gone:
            self._gone.add(pod.uid)
            if self._view.pop(pod.uid, None) is None:
                return
        elif self._view.get(pod.uid) == pod:
            return
        else:
            self._view[pod.uid] = pod
        self._publish()

    async def stop(self) -> None:
        """Cancel a list under way, end the watch."""
        self._stopping = True
        if self._feed is not None:
            self._feed.stop_watch()
        for task in (self._listing, self._saving):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


class _WatchThread:
    """One watch, read on a daemon thread of its own (a blocked read never holds up the exit);
    its changes, then its end, are handed to the event loop in order."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        changed: Callable[[PodChange], None],
        stopping: Callable[[], bool],
    ) -> None:
        self._loop = loop
        self._changed = changed
        self._stopping = stopping
        self._ended: asyncio.Future[None] = loop.create_future()

    async def run(self, feed: PodFeed, version: str, seconds: int) -> None:
        thread = threading.Thread(
            target=self._follow, args=(feed, version, seconds), name="nodeagent-pod-watch"
        )
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

    def _follow(self, feed: PodFeed, version: str, timeout: int) -> None:
        try:
            for change in feed.watch_pods(version, timeout):
                if self._stopping():
                    break
                self._hand(self._changed, change)
        except Exception as exc:
            self._hand(self._end, exc)
        else:
            self._hand(self._end, None)
