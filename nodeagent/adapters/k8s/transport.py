"""How the agent reaches the API server: a small urllib3 transport, or the official client.

The agent runs on every GPU node, so its footprint matters: importing the official client
(its ~700 generated models and their validators) costs about 15 MiB of resident memory, a fifth
of the agent. The common cases need none of it: in-cluster service-account auth, and kubeconfigs
with certificates or bearer tokens. Those are served by :class:`DirectTransport` (urllib3 and the
standard ``ssl`` module). Anything else a kubeconfig can ask for (``exec`` credential plugins,
``auth-provider``, basic auth, a proxy, a TLS server name) goes through :class:`ClientTransport`,
the official client, loaded only then. Which server and which credentials is read by the loader
both programs share (:mod:`common.kubeconfig`).
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode

import urllib3
from urllib3.connection import HTTPConnection

from common import kubeconfig
from common.kubeconfig import ClientConfig, KubeconfigError, Token

__all__ = [
    "Answer",
    "ClientTransport",
    "DirectTransport",
    "KubeconfigError",
    "Stream",
    "Transport",
    "Unsupported",
    "connect",
    "direct",
    "from_kubeconfig",
    "in_cluster",
]


def _keepalive() -> list[tuple[int, int, int]]:
    """TCP keepalive: a watch is quiet for minutes, and a peer that vanished (a partition, a
    control-plane machine lost) is noticed after about a minute instead of at the watch's read
    timeout. Where the kernel has no such options, only SO_KEEPALIVE."""
    options = [*HTTPConnection.default_socket_options, (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    return options


_KEEPALIVE = _keepalive()


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    reason: str
    body: bytes
    #: The answer's ``Date`` header (the API server's clock, whole seconds), when it had one.
    date: str | None = None


class Transport(Protocol):
    def request(
        self, method: str, path: str, query: dict[str, str], body: Any, content_type: str
    ) -> Answer:
        """One call; raises ``OSError`` / ``urllib3.exceptions.HTTPError`` when unreachable."""

    def stream(self, path: str, query: dict[str, str], read_timeout: float) -> Stream:
        """A GET whose answer is read as it comes (a watch); a read waits at most
        ``read_timeout`` seconds. Raises as :meth:`request` does."""

    def close(self) -> None: ...


@dataclass(slots=True)
class Stream:
    """An answer read line by line as the server sends it (a watch)."""

    response: urllib3.BaseHTTPResponse

    @property
    def status(self) -> int:
        return self.response.status

    @property
    def date(self) -> str | None:
        """The answer's ``Date`` header (the API server's clock), when it had one."""
        value = self.response.headers.get("Date")
        return value if isinstance(value, str) else None

    def body(self) -> bytes:
        return self.response.read()

    def lines(self) -> Iterator[bytes]:
        """Each non-empty line, as soon as it is complete."""
        buffer = bytearray()
        for chunk in self.response.stream(amt=None, decode_content=False):
            buffer.extend(chunk)
            while (end := buffer.find(b"\n")) != -1:
                line = bytes(buffer[:end])
                del buffer[: end + 1]
                if line.strip():
                    yield line

    def close(self) -> None:
        """End the answer, also from another thread blocked reading it: the socket is shut
        down first (closing alone can wait for that read). The connection is closed, never
        handed back to the pool: the reading thread may still be inside a TLS read on it, and
        a request sent on it meanwhile would interleave with that read (the API server then
        answers with a TLS decode-error alert)."""
        with contextlib.suppress(Exception):
            self.response.shutdown()
        with contextlib.suppress(Exception):
            self.response.close()


class Unsupported(Exception):
    """The configuration needs the official client (exec plugin, auth-provider, basic auth, a
    proxy, a TLS server name)."""


@dataclass(slots=True)
class DirectTransport:
    server: str
    context: ssl.SSLContext | None
    token: Token = field(default_factory=Token)
    timeout: float = 30.0
    _pool: urllib3.PoolManager = field(init=False)

    def __post_init__(self) -> None:
        # Up to three watches stay open (pods, the node, Events) beside the reads and writes.
        kwargs: dict[str, Any] = {
            "maxsize": 8,
            "retries": False,
            "socket_options": _KEEPALIVE,
        }
        if self.context is not None:
            kwargs["ssl_context"] = self.context
        self._pool = urllib3.PoolManager(**kwargs)

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "shoal-nodeagent"}
        token = self.token.get()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def stream(self, path: str, query: dict[str, str], read_timeout: float) -> Stream:
        url = self.server.rstrip("/") + path + (f"?{urlencode(query)}" if query else "")
        resp = self._pool.request(
            "GET",
            url,
            headers=self._headers(),
            timeout=urllib3.Timeout(connect=self.timeout, read=read_timeout),
            redirect=False,
            preload_content=False,
        )
        return Stream(resp)

    def request(
        self, method: str, path: str, query: dict[str, str], body: Any, content_type: str
    ) -> Answer:
        url = self.server.rstrip("/") + path + (f"?{urlencode(query)}" if query else "")
        headers = self._headers()
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        resp = self._pool.request(
            method,
            url,
            body=data,
            headers=headers,
            timeout=urllib3.Timeout(total=self.timeout),
            redirect=False,
        )
        date = resp.headers.get("Date")
        return Answer(status=resp.status, reason=resp.reason or "", body=resp.data, date=date)

    def close(self) -> None:
        self._pool.clear()


@dataclass(slots=True)
class ClientTransport:
    """Through the official client's ``ApiClient`` (every auth method kubeconfig allows)."""

    api: Any

    def request(
        self, method: str, path: str, query: dict[str, str], body: Any, content_type: str
    ) -> Answer:
        _method, url, headers, data, _post = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query.items()),
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(method, url, header_params=headers, body=data, _request_timeout=30)
        getheader = getattr(resp, "getheader", None)
        date = getheader("Date") if callable(getheader) else None
        return Answer(
            status=resp.status,
            reason=resp.reason or "",
            body=resp.read() or b"",
            date=date if isinstance(date, str) else None,
        )

    def stream(self, path: str, query: dict[str, str], read_timeout: float) -> Stream:
        _method, url, headers, _data, _post = self.api.param_serialize(
            method="GET",
            resource_path=path,
            query_params=list(query.items()),
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(
            "GET", url, header_params=headers, _request_timeout=(30, read_timeout)
        )
        return Stream(resp.response)

    def close(self) -> None:
        self.api.close()


def direct(config: ClientConfig) -> DirectTransport:
    """The light transport for ``config``; :class:`Unsupported` when it needs the official
    client, :class:`KubeconfigError` when its TLS settings do not load."""
    if config.needs_client:
        raise Unsupported(config.needs_client)
    for what, value in (("proxy-url", config.proxy), ("tls-server-name", config.tls_server_name)):
        if value:
            raise Unsupported(
                f"{config.where}: {config.cluster_at}.{what} needs the official client"
            )
    return DirectTransport(server=config.server, context=config.ssl_context(), token=config.token)


def from_kubeconfig(path: str) -> DirectTransport:
    """The current context of a kubeconfig; :class:`Unsupported` for what it cannot do,
    :class:`KubeconfigError` for a file it cannot use."""
    return direct(kubeconfig.load(path))


def in_cluster(account: Path = kubeconfig.SERVICE_ACCOUNT) -> DirectTransport:
    """The pod's service account, as every in-cluster client finds it;
    :class:`kubeconfig.NotFound` outside a cluster."""
    return direct(kubeconfig.in_cluster(account))


def connect(kubeconfig_file: str | None, *, on_fallback: Callable[[str], None]) -> Transport:
    """The lightest transport that can do what ``kubeconfig_file`` (or the pod's account)
    asks."""
    config = kubeconfig.load(kubeconfig_file)
    try:
        return direct(config)
    except Unsupported as exc:
        on_fallback(str(exc))
    from kubernetes import client
    from kubernetes import config as loader

    return ClientTransport(kubeconfig.official_client(config, client, loader))
