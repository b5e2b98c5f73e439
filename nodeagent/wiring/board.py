"""The notice board: what the workers see of the agent, over the notice socket.

The gRPC service (:class:`nodeagent.notify.server.NoticeService`) asks it who a caller is, which
notice the caller's pod is under, and hands it acknowledgements (the board satisfies
:class:`nodeagent.core.ports.Board`); the reconcile loop hands it what to tell, and it tells the
workers' open watches (:class:`nodeagent.core.ports.NoticeWatches`). The wiring creates the
board, the watches and the service; the board never sees the service. Per pod::

    not told --tell--> told --withdraw (WITHDRAWN to its watches)--> not told

A pod is told each notice once (the store remembers what it heard); a watch opened later gets
the current notice first thing. The store keeps when the pod was first told (and lets go of it
with the pod), and its acknowledgement is timed from it; the time to notify is timed from the
notice's detection, which the store keeps too. The board itself keeps nothing per pod or
notice. An accepted acknowledgement wakes the reconcile loop: the pod's eviction is
due at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from nodeagent.adapters.metrics import Metrics
from nodeagent.core.events import Notice, PodKey, PodUid
from nodeagent.core.ports import NoticeWatches
from nodeagent.core.store import AckOutcome, Store
from nodeagent.wiring.pods import PodList

log = structlog.get_logger("nodeagent")

#: Callers naming pods not in the list make the agent list its pods at most this often.
RELIST_EVERY = 1.0


class NoticeBoard:
    """Satisfies :class:`nodeagent.core.ports.Board`; tells through ``watches``."""

    def __init__(
        self,
        store: Store,
        pods: PodList,
        metrics: Metrics,
        *,
        watches: NoticeWatches,
        wake: Callable[[], None],
        identify_timeout: float = 5.0,
    ) -> None:
        self._store = store
        self._pods = pods
        self._metrics = metrics
        self._watches = watches
        self._wake = wake
        self._identify_timeout = identify_timeout

    # --- what the gRPC service asks ------------------------------------------------------------

    async def identify(self, key: PodKey, uid: PodUid) -> bool:
        pod = self._store.pod(uid)
        # A pod that started a moment ago may not be in the list yet; callers naming unknown
        # pods cannot make the agent list pods more than once a second, nor wait long for it.
        if pod is None and time.monotonic() - self._pods.tried_at > RELIST_EVERY:
            try:
                async with asyncio.timeout(self._identify_timeout):
                    await self._pods.refresh()
            except Exception as exc:
                log.info("pods_unlisted_for_caller", pod=key, error=str(exc) or type(exc).__name__)
            pod = self._store.pod(uid)
        return pod is not None and pod.key == key

    def notice_for(self, uid: PodUid) -> Notice | None:
        return self._store.pod_notice(uid)

    def watching(self, uid: PodUid) -> None:
        self._store.mark_worker(uid)
        self._metrics.watchers.set(self._watches.watchers() + 1)

    async def acknowledge(self, key: PodKey, uid: PodUid, step: int) -> AckOutcome:
        outcome = self._store.acknowledge(key, uid, step)
        if outcome is AckOutcome.ACCEPTED:
            told = self._store.told_at(uid)
            if told is not None:
                self._metrics.ack.observe(time.monotonic() - told)
            self._wake()
        return outcome

    # --- what the reconcile loop says ----------------------------------------------------------

    def tell(self, uid: PodUid, notice: Notice) -> None:
        """Tell the pod's watches ``notice``, unless they heard exactly this already."""
        now = time.monotonic()
        if not self._store.heard(uid, notice, at=now):
            return  # a watch opened later gets it first thing
        reached = self._watches.publish(uid, notice)
        detected = self._store.detected_at(notice.event_id)
        if reached and detected is not None:
            self._metrics.notify.observe(now - detected)

    def withdraw(self, uid: PodUid) -> None:
        """Tell the pod's watches that its notice was withdrawn."""
        self._watches.publish(uid, None, withdrawn=True)
        self._store.told_withdrawal(uid)

    def watchers(self) -> int:
        return self._watches.watchers()
