"""How the agent reaches the API server: a small urllib3 transport, or the official client.

The agent runs on every GPU node, so its footprint matters: importing the official client
(its ~700 generated models and their validators) costs about 15 MiB of resident memory, a fifth
of the agent. The common cases need none of it: in-cluster service-account auth, and kubeconfigs
with certificates or bearer tokens. Those are served by :class:`DirectTransport` (urllib3 and the
standard ``ssl`` module). Anything else a kubeconfig can ask for (``exec`` credential plugins,
``auth-provider``, basic auth) goes through :class:`ClientTransport`, the official client, loaded
only then.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode

import urllib3
import yaml
from urllib3.connection import HTTPConnection

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


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
        down first (closing alone can wait for that read)."""
        with contextlib.suppress(Exception):
            self.response.shutdown()
        with contextlib.suppress(Exception):
            self.response.release_conn()
            self.response.close()


class Unsupported(Exception):
    """The kubeconfig needs the official client (exec plugin, auth-provider, basic auth)."""


class KubeconfigError(ValueError):
    """The kubeconfig cannot be used. The message names the file and the field (or the line),
    never a value: a kubeconfig holds tokens and keys, and this message ends up in logs."""


@dataclass(slots=True)
class _Token:
    """A bearer token, from a value or a file re-read every minute (bound tokens rotate)."""

    value: str | None = None
    path: str | None = None
    _read_at: float = field(default=0.0, init=False)

    def get(self) -> str | None:
        if self.path is not None and time.monotonic() - self._read_at > 60.0:
            self.value = Path(self.path).read_text().strip()
            self._read_at = time.monotonic()
        return self.value


@dataclass(slots=True)
class DirectTransport:
    server: str
    context: ssl.SSLContext | None
    token: _Token = field(default_factory=_Token)
    timeout: float = 30.0
    _pool: urllib3.PoolManager = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

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
        with self._lock:
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


@contextlib.contextmanager
def _secret_file(data: bytes) -> Iterator[str]:
    """A path from which ``ssl`` can load ``data`` (it loads keys only from files), gone again
    when the block ends: ``load_cert_chain`` reads it at once and keeps the key in memory.

    On Linux the file is a memfd, reached as ``/proc/self/fd/N``: it lives in memory, is never
    on a filesystem, and disappears with the descriptor, so no exit, signal or crash can leave
    the key behind. Elsewhere it is a file in a fresh 0700 folder, removed right after loading.
    """
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("shoal-agent-secret", os.MFD_CLOEXEC)
        try:
            os.write(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    folder = tempfile.mkdtemp(prefix="shoal-agent-")
    path = os.path.join(folder, "secret")
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as f:
            f.write(data)
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.rmdir(folder)


def _load_yaml(path: str) -> Any:
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise KubeconfigError(f"kubeconfig {path}: cannot read it: {reason}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        # PyYAML's message quotes the offending line, which may be a token: name where only.
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise KubeconfigError(f"kubeconfig {path}: not valid YAML{where}") from None


def _decoded(path: str, field: str, value: Any) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        raise KubeconfigError(f"kubeconfig {path}: {field} is not valid base64") from None


def _pick(doc: dict[str, Any], path: str, section: str, name: str) -> dict[str, Any]:
    """The entry ``name`` of ``section`` (``contexts``, ``clusters``, ``users``)."""
    items = doc.get(section) or []
    if not isinstance(items, list):
        raise KubeconfigError(f"kubeconfig {path}: {section} must be a list")
    kind = section.rstrip("s")
    for item in items:
        if isinstance(item, dict) and item.get("name") == name:
            found = item.get(kind) or {}
            if not isinstance(found, dict):
                raise KubeconfigError(
                    f"kubeconfig {path}: {section}[{name!r}].{kind} must be a mapping"
                )
            return dict(found)
    raise Unsupported(f"kubeconfig: no {kind} named {name!r}")


def from_kubeconfig(path: str) -> DirectTransport:
    """The current context of a kubeconfig; :class:`Unsupported` for auth it cannot do,
    :class:`KubeconfigError` for a file it cannot use."""
    doc = _load_yaml(path)
    if not isinstance(doc, dict):
        raise KubeconfigError(f"kubeconfig {path}: not a kubeconfig (expected a mapping)")
    base = Path(path).resolve().parent

    def local(value: str) -> str:
        return str(base / value) if not os.path.isabs(value) else value

    context = _pick(doc, path, "contexts", str(doc.get("current-context", "")))
    cluster_name, user_name = str(context.get("cluster", "")), str(context.get("user", ""))
    cluster = _pick(doc, path, "clusters", cluster_name)
    user = _pick(doc, path, "users", user_name)
    if any(key in user for key in ("exec", "auth-provider", "username", "password")):
        raise Unsupported("kubeconfig user needs the official client")
    if not isinstance(cluster.get("server"), str):
        raise KubeconfigError(
            f"kubeconfig {path}: clusters[{cluster_name!r}].cluster.server is missing"
        )
    server = str(cluster["server"])
    context_ssl: ssl.SSLContext | None = None
    if server.startswith("https"):
        context_ssl = _server_trust(path, f"clusters[{cluster_name!r}].cluster", cluster, local)
        _client_certificate(path, f"users[{user_name!r}].user", user, context_ssl, local)
    token = _Token(
        value=user.get("token"),
        path=local(user["tokenFile"]) if user.get("tokenFile") else None,
    )
    return DirectTransport(server=server, context=context_ssl, token=token)


def _server_trust(
    path: str, where: str, cluster: dict[str, Any], local: Callable[[str], str]
) -> ssl.SSLContext:
    """A TLS context that trusts the cluster's server as the kubeconfig says."""
    context = ssl.create_default_context()
    if cluster.get("insecure-skip-tls-verify"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif "certificate-authority-data" in cluster:
        field = f"{where}.certificate-authority-data"
        ca = _decoded(path, field, cluster["certificate-authority-data"])
        try:
            context.load_verify_locations(cadata=ca.decode())
        except (ssl.SSLError, UnicodeDecodeError):
            raise KubeconfigError(f"kubeconfig {path}: {field} is not a certificate") from None
    elif "certificate-authority" in cluster:
        context.load_verify_locations(cafile=local(cluster["certificate-authority"]))
    return context


def _client_certificate(
    path: str,
    where: str,
    user: dict[str, Any],
    context: ssl.SSLContext,
    local: Callable[[str], str],
) -> None:
    """Load the user's client certificate and key into ``context``; the key is never left in
    a file (see :func:`_secret_file`)."""
    fields = ("client-certificate", "client-key")
    if not any(f in user or f"{f}-data" in user for f in fields):
        return
    with contextlib.ExitStack() as stack:
        paths = []
        for field in fields:
            if f"{field}-data" in user:
                data = _decoded(path, f"{where}.{field}-data", user[f"{field}-data"])
                paths.append(stack.enter_context(_secret_file(data)))
            elif field in user:
                paths.append(local(str(user[field])))
        if len(paths) < 2:
            raise KubeconfigError(
                f"kubeconfig {path}: {where} has a client certificate without its key or a key "
                "without its certificate"
            )
        try:
            context.load_cert_chain(paths[0], paths[1])
        except ssl.SSLError:
            raise KubeconfigError(
                f"kubeconfig {path}: {where}.client-certificate and client-key do not load as a "
                "certificate and its private key"
            ) from None


def in_cluster(account: Path = SERVICE_ACCOUNT) -> DirectTransport:
    """The pod's service account, as every in-cluster client finds it."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise Unsupported("not in a cluster: KUBERNETES_SERVICE_HOST is not set")
    if ":" in host:
        host = f"[{host}]"
    context_ssl = ssl.create_default_context(cafile=str(account / "ca.crt"))
    return DirectTransport(
        server=f"https://{host}:{port}",
        context=context_ssl,
        token=_Token(path=str(account / "token")),
    )


def connect(kubeconfig: str | None, *, on_fallback: Callable[[str], None]) -> Transport:
    """The lightest transport that can do what ``kubeconfig`` (or the pod's account) asks."""
    try:
        return from_kubeconfig(kubeconfig) if kubeconfig else in_cluster()
    except Unsupported as exc:
        on_fallback(str(exc))
    from kubernetes import client, config

    if kubeconfig:
        return ClientTransport(config.new_client_from_config(config_file=kubeconfig))
    config.load_incluster_config()
    return ClientTransport(client.ApiClient())
