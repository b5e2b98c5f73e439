"""This node's pods as the store knows them, and the state a started agent restores.

Where the store's pods came from (:attr:`PodList.origin`)::

    none --the pod file names pods (at start)--> disk --a pod list answered--> api
    none --a pod list answered--> api

Whether the state is restored (:attr:`PodList.restored`)::

    not restored --the node annotation read, then the pods listed--> restored

Until restored nothing is written, since a write could repeat or undo what the last agent did;
the restore is retried every ``retry_after`` until the API server answers.

Then, with a pod feed (:class:`~nodeagent.core.ports.Feed`, the API server's watch with the
field
selector ``spec.nodeName``), the pods are followed as client-go's informers do
(:class:`~nodeagent.adapters.follow.Follower`: watch from the list's version, each change applied
as it
comes, so a scheduler's reclaim reaches the workers within a second of being written; list again
on ``410 Gone``; resume where a broken watch broke). Without a feed the list is refreshed every
``every`` seconds (``every_under_notice`` while a disruptive notice is live).

Callers wanting a list at the same time (a worker naming a pod not listed yet) share one request;
while a watch follows the pods, such a list only adds the pods it did not know, since it may be
older than the watch's latest change (and never brings back a pod the watch saw go). Each change
is kept in the pod file, when there is one (:class:`nodeagent.adapters.podcache.PodCache`), for the
next
agent to start from. Every change also gives the intake the scheduler's reclaims on this node's
pods (:func:`nodeagent.core.store.reclaim_notice`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime

import structlog

from nodeagent.adapters.calls import ApiCalls
from nodeagent.adapters.follow import Follower, WatchSettings
from nodeagent.adapters.podcache import PodCache
from nodeagent.core.events import Notice, Pod, PodUid
from nodeagent.core.ports import ClusterPort, Feed, PodChange
from nodeagent.core.store import Store, reclaim_notice

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
        feed: Feed[Pod] | None = None,
        watch: WatchSettings | None = None,
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
        self._reclaims = reclaims
        #: "none", "disk" (the pod file, before the API server answered a list) or "api".
        self.origin = "none"
        self.restored = False
        #: When a pod list was last asked for (monotonic).
        self.tried_at = 0.0
        self._follower = (
            None
            if feed is None
            else Follower(
                "pod",
                feed,
                relist=lambda: self._list(whole=True),
                changed=self._changed,
                settings=watch,
            )
        )
        self._listing: asyncio.Task[None] | None = None
        self._view: dict[PodUid, Pod] = {}
        #: Pods the watch saw go while a caller's list was under way (begun before, it may still
        #: show them); let go once that list is answered.
        self._gone: set[PodUid] = set()
        self._saving: asyncio.Task[None] | None = None
        self._unsaved = False

    @property
    def watching(self) -> bool:
        """A watch follows the pods now."""
        return self._follower is not None and self._follower.watching

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
            pods, version = await self._calls.read(self._feed.list_at)
        if whole or not self.watching:
            self._view = {p.uid: p for p in pods}
            if self._follower is not None:
                self._follower.listed(version)
            self._gone.clear()
        else:
            added = [p for p in pods if p.uid not in self._view and p.uid not in self._gone]
            self._view.update((p.uid, p) for p in added)
            self._gone.clear()
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
            # With the store's worker marks (pods that opened a notice watch): an agent restarted
            # under a notice must not drain a worker in the moment before it watches again.
            workers = {p.uid for p in self._store.pods() if p.worker}
            pods = [replace(p, worker=True) if p.uid in workers else p for p in self._view.values()]
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
        if self._follower is not None:
            await self._follower.run()
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

    def _changed(self, change: PodChange) -> None:
        """One change the watch saw (never a bookmark)."""
        pod = change.item
        if pod is None:
            return
        if change.gone:
            if self._listing is not None and not self._listing.done():
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
        if self._follower is not None:
            self._follower.stop()
        for task in (self._listing, self._saving):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
