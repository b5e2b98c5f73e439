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
from typing import Any, Final, Protocol, TypeVar

import grpc
import structlog
from google.protobuf.message import DecodeError

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


Request = TypeVar("Request", pb.WatchRequest, pb.AcknowledgeRequest)


async def _decode(kind: type[Request], data: bytes, context: Any) -> Request:
    """The request, or INVALID_ARGUMENT. (Left to gRPC, an undecodable request is UNKNOWN with
    a Python traceback in the agent's log, which any process on the node could cause.)"""
    try:
        request: Request = kind.FromString(data)
        return request
    except DecodeError:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, f"not a shoal.v1.{kind.__name__} message"
        )
        raise  # abort raises; this only tells the type checker


#: Kubernetes' own limits (a namespace is a DNS label, a pod name a DNS subdomain, a uid a
#: UUID); anything longer names no pod, and is refused before it reaches a log line.
LIMITS: Final = {"namespace": 63, "name": 253, "uid": 128}
IDENTITY_REQUIRED: Final = (
    "the request must name the calling pod: namespace (at most 63 characters), name (253) "
    "and uid (128), from the Downward API"
)


def _identity(pod: Any) -> tuple[PodKey, PodUid] | None:
    fields = {field: str(getattr(pod, field)) for field in LIMITS}
    if not all(0 < len(value) <= LIMITS[field] for field, value in fields.items()):
        return None
    return PodKey(f"{fields['namespace']}/{fields['name']}"), PodUid(fields["uid"])


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
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, IDENTITY_REQUIRED)
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
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, IDENTITY_REQUIRED)
        assert ident is not None
        key, uid = ident
        outcome = await self._board.acknowledge(key, uid, int(request.step))
        log.info("worker_acknowledged", pod=key, step=int(request.step), outcome=outcome.value)
        return pb.AcknowledgeReply(accepted=outcome is AckOutcome.ACCEPTED, detail=outcome.value)

    async def _watch(self, data: bytes, context: Any) -> AsyncIterator[pb.Notice]:
        request = await _decode(pb.WatchRequest, data, context)
        async for notice in self.Watch(request, context):
            yield notice

    async def _acknowledge(self, data: bytes, context: Any) -> pb.AcknowledgeReply:
        request = await _decode(pb.AcknowledgeRequest, data, context)
        return await self.Acknowledge(request, context)

    def handler(self) -> Any:
        """The service's methods, taking the request as bytes so that the service, not gRPC,
        decides how to refuse one that does not decode."""
        return grpc.method_handlers_generic_handler(
            "shoal.v1.Notices",
            {
                "Watch": grpc.unary_stream_rpc_method_handler(
                    self._watch, response_serializer=pb.Notice.SerializeToString
                ),
                "Acknowledge": grpc.unary_unary_rpc_method_handler(
                    self._acknowledge, response_serializer=pb.AcknowledgeReply.SerializeToString
                ),
            },
        )


def _clear(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


async def serve(service: NoticeService, socket_path: str) -> Any:
    """Start the service on a unix socket (a stale socket file is replaced); returns the server."""
    path = Path(socket_path)
    _clear(path)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((service.handler(),))
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    # Pods run as other users: anyone who can reach the hostPath may connect; identity is
    # checked per call.
    os.chmod(path, 0o666)  # noqa: S103
    return server
