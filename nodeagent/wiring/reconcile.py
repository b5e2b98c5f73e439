"""The reconcile loop: whenever woken, or when the store's next moment comes, do what is due.

A turn asks the store what is due at ``now``, tells the workers first (over gRPC, before any API
write), then, once the state is restored (:class:`~nodeagent.wiring.pods.PodList`), starts the API
writes that are due (:class:`~nodeagent.wiring.executor.Executor`) and checks whether the node has
drained. A turn never waits on the API server. Between turns the loop sleeps until it is woken
(a report, an acknowledgement, a pod list, a write's result), until the store's next moment,
until a held-back write may be tried again, or for :data:`IDLE_TURN` seconds at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from datetime import datetime

from nodeagent.core.events import NotifyPod
from nodeagent.core.store import Store
from nodeagent.wiring.board import NoticeBoard
from nodeagent.wiring.drain import DrainWatch
from nodeagent.wiring.executor import Executor
from nodeagent.wiring.pods import PodList

#: The loop turns at least this often (``/healthz`` checks that it does).
IDLE_TURN = 5.0
#: Slept past a moment, so that the store finds it due.
PAST = 0.01


class Reconciler:
    """The loop (:meth:`run`); every room that changes what is due calls :meth:`wake`."""

    def __init__(
        self,
        store: Store,
        board: NoticeBoard,
        executor: Executor,
        drains: DrainWatch,
        pods: PodList,
        *,
        woken: asyncio.Event,
        clock: Callable[[], datetime],
    ) -> None:
        self._store = store
        self._board = board
        self._executor = executor
        self._drains = drains
        self._pods = pods
        self._woken = woken
        self._clock = clock
        #: When the loop last turned (monotonic), and how many times it did.
        self.heartbeat = time.monotonic()
        self.turns = 0

    def wake(self) -> None:
        self._woken.set()

    def reconcile(self) -> None:
        """Tell the workers what is due now, and start the API writes that are due (each in the
        background; its result wakes the loop for what follows, e.g. an eviction once told)."""
        actions = self._store.due(self._clock())
        for action in actions:
            if isinstance(action, NotifyPod):
                self._board.tell(action.pod.uid, action.notice)
        for uid, notice in self._store.unheard():
            self._board.tell(uid, notice)
        if not self._pods.restored:
            return
        self._executor.start(actions, time.monotonic())
        self._drains.check()

    async def run(self) -> None:
        while True:
            self.heartbeat = time.monotonic()
            self.reconcile()
            self.turns += 1
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation
            # that arrives as the event is set, and the agent then never stops.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._wait()):
                    await self._woken.wait()
            self._woken.clear()

    def _wait(self) -> float:
        """Seconds until the next thing due: the store's next moment, a retry, or a turn."""
        wait = IDLE_TURN
        now = self._clock()
        moment = self._store.next_change(now)
        if moment is not None:
            wait = min(wait, max(0.0, (moment - now).total_seconds()) + PAST)
        retry = self._executor.next_retry()
        if retry is not None:
            wait = min(wait, max(0.0, retry - time.monotonic()) + PAST)
        return wait
