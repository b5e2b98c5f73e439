"""The Notices service on a unix socket, over what the agent knows (a :class:`Board`).

Who is calling: the request names the pod (namespace, name) and its uid, which the pod gets from
the Downward API. The agent only answers a pod bound to *this* node under *that* uid, so a
process cannot watch or acknowledge for a pod elsewhere or for an earlier incarnation. An ack
is accepted only for a pod already under notice, and all it can do is make that pod leave
sooner: the worst a forged ack achieves is what the deadline would have done anyway.

What a caller can make the agent hold is bounded (:class:`SocketLimits`): any process that reaches
the hostPath can connect, and the agent shares its memory limit with everything it must do on a
notice. Watches are capped in total and per pod (refused with ``RESOURCE_EXHAUSTED``), requests
are small, a connection carries a few streams, connections with no call open are closed, peers
that stop answering pings are dropped, and a watch that falls behind is ended. Memory the closed
watches held is handed back to the system.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class SocketLimits:
    """Bounds on what callers of the notice socket can make the agent hold.

    Measured with ``tests/unit/nodeagent/test_socket_limits.py``: an open watch costs about
    40 KiB of the agent's memory, so the default cap of 256 watches is about 10 MiB.
    """

    #: Open watches, all pods together. A node's workers need a few each.
    watches: int = 256
    #: Open watches of one pod (a pod with 8 ranks each watching, plus a shell ``wait``).
    watches_per_pod: int = 16
    #: Connections open at once; more are closed as soon as they are accepted.
    connections: int = 512
    #: HTTP/2 streams one connection may have open at once (a process's watches and acks
    #: share one connection).
    streams_per_connection: int = 32
    #: A connection with no call open is closed after this many seconds.
    idle_seconds: float = 30.0
    #: Seconds between pings to each connection; one that does not answer within
    #: :data:`PING_TIMEOUT` is dropped (a stopped or wedged process holds nothing for long).
    keepalive_seconds: float = 60.0
    #: Updates a watch may fall behind by; a reader further behind is dropped.
    backlog: int = 16


#: Seconds a connection gets to answer a ping, and to speak HTTP/2 at all after connecting.
PING_TIMEOUT: Final = 10.0
#: Largest request accepted: an identity within Kubernetes' limits is well under 1 KiB.
MAX_REQUEST_BYTES: Final = 16 * 1024
#: Calls beyond the watches that may be in flight at once (acks, refusals on their way out).
OTHER_CALLS: Final = 64
#: Seconds between hand-backs of freed memory after calls.
TRIM_EVERY: Final = 2.0


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


def _trim() -> None:
    """Hand freed heap back to the system. CPython and gRPC free what closed calls and
    connections held, but glibc keeps it mapped: without this the agent stayed at its peak
    after a burst (79.5 MiB after a 3,000-watch flood against 68 MiB with it, idle 62.5).
    ``malloc_trim`` takes about 0.01 ms here; a ``gc.collect`` as well made no difference to
    the memory and cost 34 ms of event loop, so there is none."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _libc() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
        lib.malloc_trim.argtypes = [ctypes.c_size_t]
        return lib
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None


_LIBC: Final = _libc()
#: Sentinel in a watch's queue: the reader fell too far behind and is dropped.
_BEHIND: Final = pb.Notice()


class NoticeService(rpc.NoticesServicer):  # type: ignore[misc]
    def __init__(self, board: Board, limits: SocketLimits | None = None) -> None:
        self._board = board
        self.limits = limits or SocketLimits()
        self._watchers: dict[PodUid, set[asyncio.Queue[pb.Notice]]] = {}
        #: Watches admitted (counted from before the caller is identified, so that a burst of
        #: calls cannot all pass the cap while waiting for the pod list).
        self._open = 0
        self.refused = 0
        self.dropped = 0
        #: When the last call came (monotonic); memory is handed back for a while after it.
        self._called_at: float | None = None

    def watchers(self) -> int:
        return sum(len(queues) for queues in self._watchers.values())

    def publish(self, uid: PodUid, update: pb.Notice) -> int:
        """Send ``update`` to every open watch of the pod; returns how many received it."""
        queues = self._watchers.get(uid, set())
        for queue in queues:
            try:
                queue.put_nowait(update)
            except asyncio.QueueFull:
                # A reader this far behind is not reading: end its watch rather than hold
                # every update for it.
                while not queue.empty():
                    queue.get_nowait()
                queue.put_nowait(_BEHIND)
        return len(queues)

    async def _refuse(self, context: Any, detail: str) -> None:
        self.refused += 1
        if self.refused == 1 or self.refused % 1000 == 0:
            log.warning("watch_refused", detail=detail, refused=self.refused)
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, detail)

    def _called(self) -> None:
        self._called_at = time.monotonic()

    async def trim_after_calls(self) -> None:
        """Every few seconds while calls come and for a while after (connections close up to
        the idle timeout after their last call, and gRPC core frees their buffers then), hand
        freed memory back to the system."""
        while True:
            await asyncio.sleep(TRIM_EVERY)
            called = self._called_at
            quiet_after = self.limits.idle_seconds + PING_TIMEOUT + 2 * TRIM_EVERY
            if called is not None and time.monotonic() - called <= quiet_after:
                _trim()

    async def Watch(self, request: Any, context: Any) -> AsyncIterator[pb.Notice]:
        self._called()
        ident = _identity(request.pod)
        if ident is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, IDENTITY_REQUIRED)
            return
        key, uid = ident
        limits = self.limits
        if self._open >= limits.watches:
            await self._refuse(
                context,
                f"the agent has {limits.watches} watches open, its limit (--max-watches); "
                "close one or watch again later",
            )
            return
        self._open += 1
        queue: asyncio.Queue[pb.Notice] = asyncio.Queue(maxsize=limits.backlog)
        try:
            if not await self._board.identify(key, uid):
                await context.abort(grpc.StatusCode.NOT_FOUND, f"{key} ({uid}) is not on this node")
                return
            mine = self._watchers.get(uid, set())
            if len(mine) >= limits.watches_per_pod:
                await self._refuse(
                    context,
                    f"{key} has {limits.watches_per_pod} watches open, the limit per pod "
                    "(--max-watches-per-pod); close one or watch again later",
                )
                return
            self._board.watching(uid)
            self._watchers.setdefault(uid, set()).add(queue)
            log.info("worker_watching", pod=key)
            yield message(self._board.notice_for(uid))
            while True:
                update = await queue.get()
                if update is _BEHIND:
                    self.dropped += 1
                    log.warning("watch_dropped", pod=key, backlog=limits.backlog)
                    await context.abort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"this watch fell {limits.backlog} updates behind and was ended; "
                        "watch again for the current state",
                    )
                    return
                yield update
        finally:
            watchers = self._watchers.get(uid, set())
            watchers.discard(queue)
            if not watchers:
                self._watchers.pop(uid, None)
            self._open -= 1
            self._called()

    async def Acknowledge(self, request: Any, context: Any) -> pb.AcknowledgeReply:
        self._called()
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


def server_options(limits: SocketLimits) -> list[tuple[str, int]]:
    """gRPC core's own bounds on each connection."""
    ping_ms = int(PING_TIMEOUT * 1000)
    return [
        # Each connection costs gRPC core about 17 KiB before any call, 27 KiB after one: past
        # this many, a connection is closed as soon as it is accepted (the caller sees
        # UNAVAILABLE, "connection reset by peer").
        ("grpc.max_allowed_incoming_connections", limits.connections),
        ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
        ("grpc.max_concurrent_streams", limits.streams_per_connection),
        ("grpc.max_connection_idle_ms", int(limits.idle_seconds * 1000)),
        ("grpc.keepalive_time_ms", int(limits.keepalive_seconds * 1000)),
        ("grpc.keepalive_timeout_ms", ping_ms),
        # Clients may not ping more often than every 10 s (each ping is work for the agent).
        ("grpc.http2.min_ping_interval_without_data_ms", ping_ms),
        ("grpc.server_handshake_timeout_ms", ping_ms),
    ]


class NoticeServer:
    """The running gRPC server, and the task that hands memory back after a burst of calls."""

    def __init__(self, server: Any, trimmer: asyncio.Task[None]) -> None:
        self.server = server
        self._trimmer = trimmer

    async def stop(self, grace: float | None) -> None:
        self._trimmer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._trimmer
        await self.server.stop(grace)


async def serve(
    service: NoticeService, socket_path: str, limits: SocketLimits | None = None
) -> NoticeServer:
    """Start the service on a unix socket (a stale socket file is replaced)."""
    if limits is not None:
        service.limits = limits
    path = Path(socket_path)
    _clear(path)
    server = grpc.aio.server(
        options=server_options(service.limits),
        maximum_concurrent_rpcs=service.limits.watches + OTHER_CALLS,
    )
    server.add_generic_rpc_handlers((service.handler(),))
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    # Pods run as other users: anyone who can reach the hostPath may connect; identity is
    # checked per call.
    os.chmod(path, 0o666)  # noqa: S103
    return NoticeServer(server, asyncio.create_task(service.trim_after_calls()))
