"""The Notices service on a unix socket, over what the agent knows (a :class:`Board`).

Who is calling: the request names the pod (namespace, name) and its uid, which the pod gets from
the Downward API. The agent only answers a pod bound to *this* node under *that* uid, so a
process cannot watch or acknowledge for a pod elsewhere or for an earlier incarnation. An ack
is accepted only for a pod already under notice, and all it can do is make that pod leave
sooner: the worst a forged ack achieves is what the deadline would have done anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import grpc
import structlog

from nodeagent.events import Notice, PodKey, PodUid, rfc3339
from nodeagent.notify import notices_pb2 as pb
from nodeagent.notify import rpc
from nodeagent.store import AckOutcome

log = structlog.get_logger("nodeagent.notify")

DEFAULT_SOCKET = "/run/shoal/agent.sock"


class Board(Protocol):
    """What the service needs from the agent."""

    async def identify(self, key: PodKey, uid: PodUid) -> bool:
        """True when the pod is bound to this node with this uid (may refresh the pod list)."""

    def notice_for(self, uid: PodUid) -> Notice | None:
        """The notice the pod is under, if any."""

    def watching(self, uid: PodUid) -> None:
        """The pod opened a watch: it is a training worker."""

    async def acknowledge(self, key: PodKey, uid: PodUid, step: int) -> AckOutcome:
        """The pod's workers checkpointed at ``step``."""


def message(notice: Notice | None, *, withdrawn: bool = False) -> pb.Notice:
    if notice is None:
        return pb.Notice(state=pb.Notice.WITHDRAWN if withdrawn else pb.Notice.NONE)
    return pb.Notice(
        state=pb.Notice.LEAVE,
        event_id=notice.event_id,
        kind=notice.kind.value,
        source=notice.source,
        reason=notice.reason,
        leave_by=rfc3339(notice.deadline),
        leave_by_unix_ms=int(notice.deadline.timestamp() * 1000),
    )


def _identity(pod: Any) -> tuple[PodKey, PodUid] | None:
    if not (pod.namespace and pod.name and pod.uid):
        return None
    return PodKey(f"{pod.namespace}/{pod.name}"), PodUid(pod.uid)


class NoticeService(rpc.NoticesServicer):  # type: ignore[misc]
    def __init__(self, board: Board) -> None:
        self._board = board
        self._watchers: dict[PodUid, set[asyncio.Queue[pb.Notice]]] = {}

    def watchers(self) -> int:
        return sum(len(queues) for queues in self._watchers.values())

    def publish(self, uid: PodUid, update: pb.Notice) -> int:
        """Send ``update`` to every open watch of the pod; returns how many received it."""
        queues = self._watchers.get(uid, set())
        for queue in queues:
            queue.put_nowait(update)
        return len(queues)

    async def Watch(self, request: Any, context: Any) -> AsyncIterator[pb.Notice]:
        ident = _identity(request.pod)
        if ident is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "pod namespace, name, uid")
            return
        key, uid = ident
        if not await self._board.identify(key, uid):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"{key} ({uid}) is not on this node")
            return
        self._board.watching(uid)
        queue: asyncio.Queue[pb.Notice] = asyncio.Queue()
        self._watchers.setdefault(uid, set()).add(queue)
        log.info("worker_watching", pod=key)
        try:
            yield message(self._board.notice_for(uid))
            while True:
                yield await queue.get()
        finally:
            watchers = self._watchers.get(uid, set())
            watchers.discard(queue)
            if not watchers:
                self._watchers.pop(uid, None)

    async def Acknowledge(self, request: Any, context: Any) -> pb.AcknowledgeReply:
        ident = _identity(request.pod)
        if ident is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "pod namespace, name, uid")
        assert ident is not None
        key, uid = ident
        outcome = await self._board.acknowledge(key, uid, int(request.step))
        log.info("worker_acknowledged", pod=key, step=int(request.step), outcome=outcome.value)
        return pb.AcknowledgeReply(accepted=outcome is AckOutcome.ACCEPTED, detail=outcome.value)


def _clear(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


async def serve(service: NoticeService, socket_path: str) -> Any:
    """Start the service on a unix socket (a stale socket file is replaced); returns the server."""
    path = Path(socket_path)
    _clear(path)
    server = grpc.aio.server()
    rpc.add_servicer(service, server)
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    # Pods run as other users: anyone who can reach the hostPath may connect; identity is
    # checked per call.
    os.chmod(path, 0o666)  # noqa: S103
    return server
