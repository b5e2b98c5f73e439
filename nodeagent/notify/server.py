"""The Notices service on a unix socket, over what the agent knows (a
:class:`~nodeagent.core.ports.Board`), and the open watches the agent publishes to
(:class:`Watches`).

Who is calling: the request names the pod (namespace, name) and its uid, which the pod gets from
the Downward API. The agent only answers a pod bound to *this* node under *that* uid, so a
process cannot watch or acknowledge for a pod elsewhere or for an earlier incarnation. An ack
is accepted only for a pod already under notice, and all it can do is make that pod leave
sooner: the worst a forged ack achieves is what the deadline would have done anyway. On a
platform without pods (Slurm, protocol 0.3.0) a caller names its job step instead, and the
service admits it only when the platform places the calling process in that step
(:class:`~nodeagent.notify.peers.StepGate`; the process is known from the kernel through the
relay in :mod:`nodeagent.notify.peers`); pod identities are then refused. A progress
report (protocol 0.2.0) is taken under the same check and handed to a
:class:`~nodeagent.core.progress.ProgressSink`, which writes it on the pod at most once a minute:
a forged one can only misstate how much the pod itself would lose.

What a caller can make the agent hold is bounded (:class:`SocketLimits`): any process that reaches
the hostPath can connect, and the agent shares its memory limit with everything it must do on a
notice. Watches are capped in total and per pod (refused with ``RESOURCE_EXHAUSTED``), requests
are small, a connection carries a few streams, connections with no call open are closed, peers
that stop answering pings are dropped, and a watch that falls behind is ended. Memory the closed
watches held is handed back to the system.

The socket is kept at its path (:class:`NoticeServer`): removed or replaced while the agent runs
(a node clean-up, a tmpfs mounted again), it is served again within about a second, and while it
cannot be, ``/healthz`` fails with the reason so that the kubelet restarts the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import math
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import grpc
import structlog
from google.protobuf.message import DecodeError
from shoal_worker.protocol import notices_pb2 as pb
from shoal_worker.protocol import rpc

from contracts import progress as progress_doc
from contracts.progress import Progress, ProgressError
from contracts.times import LATEST
from nodeagent.adapters.metrics import Metrics
from nodeagent.core.events import Notice, PodKey, PodUid, rfc3339
from nodeagent.core.ports import Board
from nodeagent.core.progress import ProgressSink
from nodeagent.core.store import AckOutcome
from nodeagent.notify.peers import PeerRelay, StepGate
from nodeagent.notify.socketfile import Change, FileId, Folder, can_bind, change, clear, listening

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


def progress_of(request: pb.ProgressRequest, reported_at: float) -> Progress:
    """The report in a ``ProgressRequest``, received at ``reported_at`` (seconds since the
    epoch, the agent's clock), validated as the ``shoal.dev/progress`` document is read
    (:func:`contracts.progress.decode`); raises :class:`ProgressError` naming the field. The
    worker's side is ``shoal_worker.progress.request``."""
    at_ms = int(request.checkpoint_unix_ms)
    checkpoint_at = at_ms / 1000 if at_ms else None
    if checkpoint_at is not None and not 0 < checkpoint_at < _LATEST_S:
        raise ProgressError(f"checkpoint_unix_ms: not a time, got {at_ms}")
    for name in ("step_seconds", "checkpoint_seconds"):
        if not math.isfinite(getattr(request, name)):
            raise ProgressError(f"{name}: want seconds, got {getattr(request, name)!r}")
    report = Progress(
        step=int(request.step),
        step_seconds=float(request.step_seconds),
        checkpoint_step=int(request.checkpoint_step),
        checkpoint_at=checkpoint_at,
        checkpoint_seconds=float(request.checkpoint_seconds),
        reported_at=reported_at,
    )
    # One home for what a valid document is: the codec the scheduler reads it with.
    return progress_doc.decode(progress_doc.encode(report))


#: Times past this are garbage (the codec's own bound).
_LATEST_S: Final = LATEST.timestamp()

Request = TypeVar("Request", pb.WatchRequest, pb.AcknowledgeRequest, pb.ProgressRequest)


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


STEP_REQUIRED: Final = (
    "this agent serves Slurm job steps: the request must name the calling job step "
    "(SLURM_JOB_ID, SLURM_STEP_ID, SLURMD_NODENAME)"
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


@dataclass(slots=True)
class Calls:
    """The calls one gRPC server has open, and since when it has had none (monotonic)."""

    open: int = 0
    quiet_since: float = field(default_factory=time.monotonic)

    def began(self) -> None:
        self.open += 1

    def ended(self) -> None:
        self.open -= 1
        self.quiet_since = time.monotonic()

    def quiet_for(self, now: float) -> float:
        """Seconds without a call open (0 while one is)."""
        return 0.0 if self.open else now - self.quiet_since


class Watches:
    """The open watches of each pod: the service opens and closes them, the notice board
    publishes to them (it sees them as :class:`nodeagent.core.ports.NoticeWatches`)."""

    def __init__(self) -> None:
        self._queues: dict[PodUid, set[asyncio.Queue[pb.Notice]]] = {}

    def watchers(self) -> int:
        return sum(len(queues) for queues in self._queues.values())

    def of(self, uid: PodUid) -> int:
        """How many watches the pod has open."""
        return len(self._queues.get(uid, ()))

    def opened(self, uid: PodUid, queue: asyncio.Queue[pb.Notice]) -> None:
        self._queues.setdefault(uid, set()).add(queue)

    def closed(self, uid: PodUid, queue: asyncio.Queue[pb.Notice]) -> None:
        queues = self._queues.get(uid, set())
        queues.discard(queue)
        if not queues:
            self._queues.pop(uid, None)

    def publish(self, uid: PodUid, notice: Notice | None, *, withdrawn: bool = False) -> int:
        return self.send(uid, message(notice, withdrawn=withdrawn))

    def send(self, uid: PodUid, update: pb.Notice) -> int:
        """Send ``update`` to every open watch of the pod; returns how many received it."""
        queues = self._queues.get(uid, set())
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


class NoticeService(rpc.NoticesServicer):  # type: ignore[misc]
    """The service over ``board``; its watches are ``watches`` (the board publishes to the same
    :class:`Watches`, created by the wiring)."""

    def __init__(
        self,
        board: Board,
        limits: SocketLimits | None = None,
        watches: Watches | None = None,
        *,
        progress: ProgressSink | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._board = board
        #: Where progress reports go (None: the call is answered UNIMPLEMENTED, as by an agent
        #: older than protocol 0.2.0); ``wall`` stamps them.
        self._progress = progress
        self._wall = wall
        self.progress_refused = 0
        self.limits = limits or SocketLimits()
        self.watches = watches or Watches()
        #: Watches admitted (counted from before the caller is identified, so that a burst of
        #: calls cannot all pass the cap while waiting for the pod list).
        self._open = 0
        self.refused = 0
        self.dropped = 0
        #: When the last call came (monotonic); memory is handed back for a while after it.
        self._called_at: float | None = None
        #: On a platform without pods (Slurm): callers name a job step, checked through this
        #: gate, and no pod identity is taken (docs/slurm.md).
        self.steps: StepGate | None = None

    def watchers(self) -> int:
        return self.watches.watchers()

    def publish(self, uid: PodUid, update: pb.Notice) -> int:
        """Send ``update`` to every open watch of the pod; returns how many received it."""
        return self.watches.send(uid, update)

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

    async def _caller(self, pod: Any, context: Any) -> tuple[PodKey, PodUid] | None:
        """Who is calling: the pod it names, or, with a step gate, the job step it names once
        the platform has admitted the calling process; None (after aborting) when neither."""
        if self.steps is None:
            if pod.HasField("slurm"):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, IDENTITY_REQUIRED)
                return None
            ident = _identity(pod)
            if ident is None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, IDENTITY_REQUIRED)
            return ident
        if not pod.HasField("slurm"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, STEP_REQUIRED)
            return None
        admitted = await self.steps.admit(pod.slurm, context.peer())
        if isinstance(admitted, str):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, admitted)
            return None
        return admitted

    async def Watch(self, request: Any, context: Any) -> AsyncIterator[pb.Notice]:
        self._called()
        ident = await self._caller(request.pod, context)
        if ident is None:
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
            if self.watches.of(uid) >= limits.watches_per_pod:
                await self._refuse(
                    context,
                    f"{key} has {limits.watches_per_pod} watches open, the limit per pod "
                    "(--max-watches-per-pod); close one or watch again later",
                )
                return
            self._board.watching(uid)
            self.watches.opened(uid, queue)
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
            self.watches.closed(uid, queue)
            self._open -= 1
            self._called()

    async def Acknowledge(self, request: Any, context: Any) -> pb.AcknowledgeReply:
        self._called()
        ident = await self._caller(request.pod, context)
        assert ident is not None
        key, uid = ident
        outcome = await self._board.acknowledge(key, uid, int(request.step))
        log.info("worker_acknowledged", pod=key, step=int(request.step), outcome=outcome.value)
        return pb.AcknowledgeReply(accepted=outcome is AckOutcome.ACCEPTED, detail=outcome.value)

    async def Progress(self, request: Any, context: Any) -> pb.ProgressReply:
        self._called()
        sink = self._progress
        if sink is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "progress reports are not taken")
        ident = await self._caller(request.pod, context)
        assert sink is not None
        assert ident is not None
        key, uid = ident
        if not await self._board.identify(key, uid):
            return self._progress_refused(key, "not-on-node")
        try:
            report = progress_of(request, self._wall())
        except ProgressError as exc:
            return self._progress_refused(key, f"invalid: {exc}")
        sink.report(key, uid, report)
        return pb.ProgressReply(accepted=True, detail="accepted")

    def _progress_refused(self, key: PodKey, detail: str) -> pb.ProgressReply:
        self.progress_refused += 1
        if self.progress_refused == 1 or self.progress_refused % 1000 == 0:
            log.warning("progress_refused", pod=key, detail=detail, refused=self.progress_refused)
        return pb.ProgressReply(accepted=False, detail=detail)

    async def _watch(self, data: bytes, context: Any) -> AsyncIterator[pb.Notice]:
        request = await _decode(pb.WatchRequest, data, context)
        async for notice in self.Watch(request, context):
            yield notice

    async def _acknowledge(self, data: bytes, context: Any) -> pb.AcknowledgeReply:
        request = await _decode(pb.AcknowledgeRequest, data, context)
        return await self.Acknowledge(request, context)

    async def _report(self, data: bytes, context: Any) -> pb.ProgressReply:
        request = await _decode(pb.ProgressRequest, data, context)
        return await self.Progress(request, context)

    def handler(self, calls: Calls | None = None) -> Any:
        """The service's methods, taking the request as bytes so that the service, not gRPC,
        decides how to refuse one that does not decode; ``calls`` counts those of one server."""
        counted = calls or Calls()

        async def watch(data: bytes, context: Any) -> AsyncIterator[pb.Notice]:
            counted.began()
            try:
                async for notice in self._watch(data, context):
                    yield notice
            finally:
                counted.ended()

        async def acknowledge(data: bytes, context: Any) -> pb.AcknowledgeReply:
            counted.began()
            try:
                return await self._acknowledge(data, context)
            finally:
                counted.ended()

        async def report(data: bytes, context: Any) -> pb.ProgressReply:
            counted.began()
            try:
                return await self._report(data, context)
            finally:
                counted.ended()

        return grpc.method_handlers_generic_handler(
            "shoal.v1.Notices",
            {
                "Watch": grpc.unary_stream_rpc_method_handler(
                    watch, response_serializer=pb.Notice.SerializeToString
                ),
                "Acknowledge": grpc.unary_unary_rpc_method_handler(
                    acknowledge, response_serializer=pb.AcknowledgeReply.SerializeToString
                ),
                "Progress": grpc.unary_unary_rpc_method_handler(
                    report, response_serializer=pb.ProgressReply.SerializeToString
                ),
            },
        )


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


#: Seconds between checks that the socket path still holds the socket the agent serves.
CHECK_EVERY: Final = 1.0


@dataclass(slots=True)
class _Bound:
    """One gRPC server on the socket path, and the socket file it made."""

    server: Any
    file: FileId | None
    calls: Calls
    #: What accepts callers at the path when the agent reads their credentials
    #: (:class:`~nodeagent.notify.peers.PeerRelay`); None when gRPC does.
    front: asyncio.AbstractServer | None = None

    async def stop(self, grace: float | None) -> None:
        if self.front is not None:
            self.front.close()
        await self.server.stop(grace)


class NoticeServer:
    """The Notices service on its unix socket, kept served at that path.

    Every :data:`CHECK_EVERY` seconds the path is checked (:func:`socketfile.change`)::

        serving --path removed, or another file there--> folder made again as at start-up,
                    a new server bound at the path (logged, counted) --> serving
        serving --the new bind fails, or another process listens at the path--> unserved
        unserved --/healthz fails with the reason; checked again each second--> serving

    A server whose socket is gone keeps its connections: workers connected before the socket
    was removed keep hearing notices through it. Once it has had no call open for longer than a
    connection may stay idle (gRPC has closed every connection to it), it is stopped.
    """

    def __init__(
        self,
        service: NoticeService,
        path: Path,
        *,
        metrics: Metrics | None = None,
        check_every: float = CHECK_EVERY,
        relay: PeerRelay | None = None,
    ) -> None:
        self._service = service
        self._relay = relay
        self.path = path
        self._metrics = metrics
        self._check_every = check_every
        self._folder: Folder | None = None
        #: Servers whose socket is gone, oldest first, until their connections have closed.
        self._retiring: list[_Bound] = []
        self._current: _Bound | None = None
        self.problem: str | None = None
        self.recreated = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._checking = asyncio.Lock()
        self._binds = 0

    async def start(self) -> None:
        """Serve at the path (a stale socket file there is replaced); raises when it cannot."""
        self._folder = Folder.made(self.path.parent)
        self._current = await self._bind()
        self._serving(ok=True)
        self._tasks = [
            asyncio.create_task(self._service.trim_after_calls()),
            asyncio.create_task(self._keep(), name="nodeagent-notice-socket"),
        ]

    async def _bind(self) -> _Bound:
        """A new server, bound under a name of its own and then renamed to the path: the path
        never lacks a socket, and since gRPC removes the socket file under the name it bound
        when a server stops, stopping a replaced server leaves the path alone."""
        limits = self._service.limits
        self._binds += 1
        bound_at = self.path.with_name(f".{self.path.name}.{self._binds}")
        clear(bound_at)
        can_bind(bound_at)
        calls = Calls()
        server = grpc.aio.server(
            options=server_options(limits), maximum_concurrent_rpcs=limits.watches + OTHER_CALLS
        )
        server.add_generic_rpc_handlers((self._service.handler(calls),))
        relay = self._relay
        # With a relay, gRPC listens in the relay's private folder and the relay at the path.
        inner = bound_at if relay is None else relay.inner(self._binds)
        server.add_insecure_port(f"unix:{inner}")
        await server.start()
        front = None
        try:
            if relay is not None:
                front = await relay.serve(bound_at, inner)
            # Pods run as other users: anyone who can reach the hostPath may connect; identity
            # is checked per call.
            os.chmod(bound_at, 0o666)  # noqa: S103
            os.replace(bound_at, self.path)
        except OSError:
            if front is not None:
                front.close()
            await server.stop(0)
            raise
        return _Bound(server, FileId.at(self.path), calls, front)

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(self._check_every)
            try:
                await self.check()
            except Exception as exc:  # a fault here must show in /healthz, not end the checks
                log.exception("notice_socket_check_failed", path=str(self.path))
                self._unserved(f"the socket check failed: {exc!r}")

    async def check(self, now: float | None = None) -> None:
        """Serve the path again if its socket is gone; stop the servers nobody can reach any
        more (``now``: monotonic seconds, the present when None)."""
        async with self._checking:
            await self._retire(time.monotonic() if now is None else now)
            served = self._current.file if self._current is not None else None
            what = change(served, FileId.at(self.path))
            if what is None:
                return
            if what is Change.REPLACED and listening(self.path):
                self._unserved(
                    f"another process serves a socket at {self.path}; the agent does not take "
                    "it back (is a second agent running on this node?)"
                )
                return
            await self._serve_again(what)

    async def _serve_again(self, what: Change) -> None:
        assert self._folder is not None
        try:
            folder_made = self._folder.restore()
            bound = await self._bind()
        except (OSError, RuntimeError) as exc:
            self._unserved(self._why_not(exc))
            return
        if self._current is not None:
            self._retiring.append(self._current)
        self._current = bound
        self.recreated += 1
        if self._metrics is not None:
            self._metrics.socket_recreated.labels(what.value).inc()
        log.warning(
            "notice_socket_recreated",
            path=str(self.path),
            reason=what.value,
            detail=_DETAIL[what],
            folder_recreated=folder_made,
            after_problem=self.problem,
        )
        self._serving(ok=True)

    def _why_not(self, exc: BaseException) -> str:
        assert self._folder is not None
        cause = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if self._folder.removed_under_mount():
            return (
                f"cannot serve {self.path} again: its folder was removed from the node while "
                "mounted here; only a restart mounts it again"
            )
        return f"cannot serve {self.path} again: {cause}"

    def _unserved(self, problem: str) -> None:
        if problem != self.problem:
            log.error("notice_socket_unserved", path=str(self.path), problem=problem)
        self.problem = problem
        self._serving(ok=False)

    def _serving(self, *, ok: bool) -> None:
        if ok:
            self.problem = None
        if self._metrics is not None:
            self._metrics.socket_serving.set(1 if ok else 0)

    async def _retire(self, now: float) -> None:
        # Past this, gRPC has closed every connection with no call open (and a peer that never
        # spoke HTTP/2): nothing can reach the server any more.
        after = self._service.limits.idle_seconds + PING_TIMEOUT
        done = [b for b in self._retiring if b.calls.quiet_for(now) > after]
        for bound in done:
            self._retiring.remove(bound)
            await bound.stop(0)

    def live(self) -> tuple[bool, dict[str, Any]]:
        """For ``/healthz``: whether new workers can connect at the path, and why not."""
        ended = [t for t in self._tasks if t.done()]
        problem = self.problem
        if ended and problem is None:
            problem = "the socket check stopped"
        return problem is None, {
            "path": str(self.path),
            "serving": problem is None,
            "problem": problem,
            "recreated": self.recreated,
            "servers": len(self._retiring) + (self._current is not None),
        }

    async def stop(self, grace: float | None) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        bound = [*self._retiring, *([self._current] if self._current is not None else [])]
        await asyncio.gather(*(b.stop(grace) for b in bound))
        if self._relay is not None:
            self._relay.close()
        # Gone with the agent: a worker then finds no socket (and falls back to its leave-by
        # file) rather than one nobody answers. Another's socket at the path is left.
        if self._current is not None and FileId.at(self.path) == self._current.file:
            clear(self.path)


_DETAIL: Final = {
    Change.REMOVED: "the socket file was removed (or its folder)",
    Change.REPLACED: "another file took the socket's place",
}


async def serve(
    service: NoticeService,
    socket_path: str,
    limits: SocketLimits | None = None,
    *,
    metrics: Metrics | None = None,
    check_every: float = CHECK_EVERY,
    relay: PeerRelay | None = None,
) -> NoticeServer:
    """Start the service on a unix socket (a stale socket file is replaced) and keep it served
    there (:class:`NoticeServer`); with ``relay``, the relay accepts the callers and reads their
    credentials (:mod:`nodeagent.notify.peers`)."""
    if limits is not None:
        service.limits = limits
    if relay is not None:
        relay.limit = service.limits.connections
    server = NoticeServer(
        service, Path(socket_path), metrics=metrics, check_every=check_every, relay=relay
    )
    await server.start()
    return server
