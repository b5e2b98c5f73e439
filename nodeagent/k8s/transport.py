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
import json
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode

import urllib3
import yaml

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    reason: str
    body: bytes


class Transport(Protocol):
    def request(
        self, method: str, path: str, query: dict[str, str], body: Any, content_type: str
    ) -> Answer:
        """One call; raises ``OSError`` / ``urllib3.exceptions.HTTPError`` when unreachable."""

    def close(self) -> None: ...


class Unsupported(Exception):
    """The kubeconfig needs the official client (exec plugin, auth-provider, basic auth)."""


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
        kwargs: dict[str, Any] = {"maxsize": 4, "retries": False}
        if self.context is not None:
            kwargs["ssl_context"] = self.context
        self._pool = urllib3.PoolManager(**kwargs)

    def request(
        self, method: str, path: str, query: dict[str, str], body: Any, content_type: str
    ) -> Answer:
        url = self.server.rstrip("/") + path + (f"?{urlencode(query)}" if query else "")
        headers = {"Accept": "application/json", "User-Agent": "shoal-nodeagent"}
        with self._lock:
            token = self.token.get()
        if token:
            headers["Authorization"] = f"Bearer {token}"
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
        return Answer(status=resp.status, reason=resp.reason or "", body=resp.data)

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
        return Answer(status=resp.status, reason=resp.reason or "", body=resp.read() or b"")

    def close(self) -> None:
        self.api.close()


def _materialize(data_b64: str, suffix: str, into: Path) -> str:
    """Write base64 ``*-data`` to a private file (``ssl`` only loads keys from files)."""
    fd, name = tempfile.mkstemp(suffix=suffix, dir=into)
    with os.fdopen(fd, "wb") as f:
        f.write(base64.b64decode(data_b64))
    return name


def from_kubeconfig(path: str) -> DirectTransport:
    """The current context of a kubeconfig; :class:`Unsupported` for auth it cannot do."""
    doc = yaml.safe_load(Path(path).read_text())
    base = Path(path).resolve().parent

    def pick(section: str, name: str) -> dict[str, Any]:
        for item in doc.get(section) or []:
            if item.get("name") == name:
                return dict(item.get(section.rstrip("s")) or {})
        raise Unsupported(f"kubeconfig: no {section.rstrip('s')} named {name!r}")

    context = pick("contexts", doc.get("current-context", ""))
    cluster = pick("clusters", context.get("cluster", ""))
    user = pick("users", context.get("user", ""))
    if any(key in user for key in ("exec", "auth-provider", "username", "password")):
        raise Unsupported("kubeconfig user needs the official client")

    def local(value: str) -> str:
        return str(base / value) if not os.path.isabs(value) else value

    server = str(cluster["server"])
    secrets = Path(tempfile.mkdtemp(prefix="shoal-agent-"))
    context_ssl: ssl.SSLContext | None = None
    if server.startswith("https"):
        context_ssl = ssl.create_default_context()
        if cluster.get("insecure-skip-tls-verify"):
            context_ssl.check_hostname = False
            context_ssl.verify_mode = ssl.CERT_NONE
        elif "certificate-authority-data" in cluster:
            ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
            context_ssl.load_verify_locations(cadata=ca)
        elif "certificate-authority" in cluster:
            context_ssl.load_verify_locations(cafile=local(cluster["certificate-authority"]))
        cert = user.get("client-certificate")
        key = user.get("client-key")
        if "client-certificate-data" in user:
            cert = _materialize(user["client-certificate-data"], ".crt", secrets)
        if "client-key-data" in user:
            key = _materialize(user["client-key-data"], ".key", secrets)
        if cert and key:
            context_ssl.load_cert_chain(local(cert), local(key))
    token = _Token(
        value=user.get("token"),
        path=local(user["tokenFile"]) if user.get("tokenFile") else None,
    )
    return DirectTransport(server=server, context=context_ssl, token=token)


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
