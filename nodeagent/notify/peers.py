"""Which process is calling: the notice socket's callers as the kernel knows them.

gRPC does not tell a service which process is at the other end of a unix socket. Where callers
must be checked with the platform, not taken at their word (a Slurm job step: the agent asks
Slurm whether the calling process is in the step it names; docs/slurm.md), the agent accepts
the connections itself (:class:`PeerRelay`): it reads each caller's credentials
(``SO_PEERCRED``: pid, uid, gid, recorded by the kernel at ``connect``), connects to the gRPC
server's own socket, which lies in a folder only the agent can enter, from an address of its
own, and copies the bytes both ways. gRPC names that address as the call's peer
(``unix-abstract:...``), and :meth:`PeerRelay.of` gives the credentials behind it for as long as
the connection lasts. No caller can reach the gRPC socket, so no caller can choose the address.

:class:`StepGate` is what the service asks about a caller that names a job step: the
credentials from the relay, the decision from the platform (:class:`StepCallers`).

Per connection::

    accepted --credentials read, connected inward--> relayed --either side closes--> closed
    accepted --over the connection limit, or the inward connect fails--> closed
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import shutil
import socket
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from nodeagent.core.events import PodKey, PodUid

log = structlog.get_logger("nodeagent.notify")

_UCRED = struct.Struct("3i")
#: Bytes read at a time from either side.
_CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class Peer:
    """A caller's credentials (``SO_PEERCRED``)."""

    pid: int
    uid: int
    gid: int


def credentials(sock: Any) -> Peer:
    """The credentials of the process at the other end of a connected unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return Peer(pid=pid, uid=uid, gid=gid)


class PeerRelay:
    """Accepts the notice socket's connections, and knows each caller's credentials by the
    address it relays them from. At most ``limit`` connections at once (more are closed as
    soon as accepted, as gRPC does past ``--max-connections``)."""

    def __init__(self, limit: int = 512) -> None:
        self.limit = limit
        self._peers: dict[str, Peer] = {}
        self._open = 0
        self._count = 0
        self._tag = f"{os.getpid()}-{secrets.token_hex(6)}"
        self._folder: Path | None = None

    def inner(self, n: int) -> Path:
        """Where the ``n``-th gRPC server listens: in a folder of the agent's alone (0700)."""
        if self._folder is None or not self._folder.is_dir():
            self._folder = Path(tempfile.mkdtemp(prefix="shoal-agent-"))
        return self._folder / f"grpc.{n}.sock"

    async def serve(self, at: Path, inner: Path) -> asyncio.AbstractServer:
        """Accept callers at ``at`` (the public socket, before it is renamed into place) and
        relay each to the gRPC server at ``inner``."""
        handle = functools.partial(self._relay, inner)
        return await asyncio.start_unix_server(handle, path=str(at))

    def of(self, peer: str) -> Peer | None:
        """The credentials of the caller behind the gRPC peer ``peer`` (``context.peer()``)."""
        return self._peers.get(peer)

    @property
    def connections(self) -> int:
        return self._open

    async def _relay(
        self, inner: Path, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if self._open >= self.limit:
            writer.close()
            return
        self._open += 1
        name: str | None = None
        try:
            peer = credentials(writer.get_extra_info("socket"))
            self._count += 1
            name = f"shoal-peer-{self._tag}-{self._count}"
            out = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            out.setblocking(False)
            try:
                out.bind(f"\0{name}")
                await asyncio.get_running_loop().sock_connect(out, str(inner))
            except OSError:
                out.close()
                raise
            inward_reader, inward_writer = await asyncio.open_unix_connection(sock=out)
            self._peers[f"unix-abstract:{name}"] = peer
            await asyncio.gather(
                _pipe(reader, inward_writer), _pipe(inward_reader, writer), return_exceptions=True
            )
        except OSError as exc:
            log.warning("notice_socket_relay_failed", error=str(exc) or type(exc).__name__)
        finally:
            if name is not None:
                self._peers.pop(f"unix-abstract:{name}", None)
            self._open -= 1
            writer.close()

    def close(self) -> None:
        """Remove the private folder (the gRPC servers in it are stopped)."""
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy until ``source`` ends, then close ``sink`` (so the other side ends too)."""
    try:
        while data := await source.read(_CHUNK):
            sink.write(data)
            await sink.drain()
    finally:
        sink.close()
        with contextlib.suppress(Exception):
            await sink.wait_closed()


class StepCallers(Protocol):
    """The platform's check of a caller that names a job step (Slurm:
    :class:`nodeagent.adapters.slurm.SlurmCallers`)."""

    async def admit(self, job: str, step: str, node: str, pid: int) -> tuple[PodKey, PodUid] | str:
        """The key and uid the job has in the agent's core, when process ``pid`` runs in
        ``job``.``step`` on node ``node`` (this node); else why the caller is refused."""


@dataclass(frozen=True, slots=True)
class StepGate:
    """Callers naming a job step: their process from the relay, the decision from the
    platform. An agent with a gate takes no pod identities."""

    callers: StepCallers
    relay: PeerRelay

    async def admit(self, step: Any, peer: str) -> tuple[PodKey, PodUid] | str:
        """``step``: the request's ``SlurmStep``; ``peer``: ``context.peer()``."""
        caller = self.relay.of(peer)
        if caller is None:
            return "the calling process is not known (connect through the agent's socket)"
        return await self.callers.admit(
            str(step.job_id)[:64], str(step.step_id)[:64], str(step.node)[:256], caller.pid
        )
