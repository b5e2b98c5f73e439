"""Where the API server is and who we are to it: the one kubeconfig loader of both programs and
``kubectl shoal``.

:func:`load` finds the configuration as kubectl does — a kubeconfig file named by the caller;
with ``discover``, else ``$KUBECONFIG`` (a list of files, merged: the first to name an entry or
the current context wins) or ``~/.kube/config``; else the pod's service account
(``KUBERNETES_SERVICE_HOST``/``_PORT`` and the files under :data:`SERVICE_ACCOUNT`) — selects a
context (the one asked for, else the current one) and reads its cluster and user into a
:class:`ClientConfig`: the server, TLS (a CA from data or a file, or no verification; the server
name to expect; a client certificate and key from data or files), a bearer token (a value, or a
file re-read every minute: bound tokens rotate), a proxy, and the context's namespace. Relative
paths are read from the folder of the file that names them.

A user the loader does not serve itself (``exec`` credential plugins, ``auth-provider``, basic
auth) is still a :class:`ClientConfig`, with :attr:`ClientConfig.needs_client` saying why:
the caller hands such a configuration to the official client (:attr:`ClientConfig.files`,
:attr:`ClientConfig.context`). Callers turn a configuration into their own client: an
``ssl.SSLContext`` (:meth:`ClientConfig.ssl_context`, the agent's urllib3 transport) or the
official client's ``Configuration`` attributes (:meth:`ClientConfig.official`); this module
imports no client library.

Errors name the file and the field (or the line), never a value: a kubeconfig holds tokens and
keys, and these messages end up in logs and on terminals. Client keys given as data are never
written to a filesystem (:func:`_secret_file`).
"""

from __future__ import annotations

import atexit
import base64
import binascii
import contextlib
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")

#: Fields holding a path, read relative to the file that names them.
_PATHS = {
    "cluster": ("certificate-authority",),
    "user": ("client-certificate", "client-key", "tokenFile"),
}
#: What a user may need that only the official client does.
_CLIENT_ONLY = ("exec", "auth-provider", "username", "password")


class KubeconfigError(ValueError):
    """The configuration cannot be used. The message names the file and the field (or the
    line), never a value."""


class NotFound(KubeconfigError):
    """No kubeconfig was found and this is not a pod in a cluster."""


@dataclass(slots=True)
class Token:
    """A bearer token, from a value or a file re-read every minute (bound tokens rotate)."""

    value: str | None = None
    path: str | None = None
    _read_at: float = field(default=-float("inf"), init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def get(self) -> str | None:
        with self._lock:
            if self.path is not None and time.monotonic() - self._read_at > 60.0:
                self.value = Path(self.path).read_text().strip()
                self._read_at = time.monotonic()
            return self.value


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """One cluster and user, as a client needs them."""

    server: str
    #: Where it came from, for messages: ``kubeconfig PATH`` or ``in-cluster config``.
    where: str
    #: The files (joined with ``os.pathsep``; empty in a cluster) and the context chosen.
    files: str = ""
    context: str | None = None
    namespace: str = "default"
    ca_data: bytes | None = None
    ca_file: str | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    proxy: str | None = None
    cert_data: bytes | None = None
    cert_file: str | None = None
    key_data: bytes | None = None
    key_file: str | None = None
    token: Token = field(default_factory=Token)
    #: Why only the official client can use this user (None: any client can).
    needs_client: str | None = None
    #: Where in the file the cluster and the user are, for messages.
    cluster_at: str = "cluster"
    user_at: str = "user"

    def ssl_context(self) -> ssl.SSLContext | None:
        """A TLS context that trusts the server and presents the client certificate as the
        configuration says (None for plain HTTP); the key is never left in a file."""
        if not self.server.startswith("https"):
            return None
        if self.insecure:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif self.ca_data is not None:
            try:
                # Only the cluster's CA is trusted (as kubectl and the official client do).
                context = ssl.create_default_context(cadata=self.ca_data.decode())
            except (ssl.SSLError, UnicodeDecodeError):
                raise KubeconfigError(
                    f"{self.where}: {self.cluster_at}.certificate-authority-data is not a "
                    "certificate"
                ) from None
        elif self.ca_file is not None:
            context = ssl.create_default_context(cafile=self.ca_file)
        else:
            context = ssl.create_default_context()
        self._client_certificate(context)
        return context

    def _client_certificate(self, context: ssl.SSLContext) -> None:
        with contextlib.ExitStack() as stack:
            cert = self.cert_file
            if self.cert_data is not None:
                cert = stack.enter_context(_secret_file(self.cert_data))
            key = self.key_file
            if self.key_data is not None:
                key = stack.enter_context(_secret_file(self.key_data))
            if cert is None or key is None:
                return
            try:
                context.load_cert_chain(cert, key)
            except ssl.SSLError:
                raise KubeconfigError(
                    f"{self.where}: {self.user_at}.client-certificate and client-key do not "
                    "load as a certificate and its private key"
                ) from None

    def official(self) -> dict[str, Any]:
        """The official client's ``Configuration`` attributes for this configuration (set each
        with ``setattr``). Certificates and keys given as data are handed over as paths to
        in-memory files (:func:`_held_file`), which that client reads at each connection."""
        settings: dict[str, Any] = {
            "host": self.server,
            "verify_ssl": not self.insecure,
            "ssl_ca_cert": _held_file(self.ca_data) if self.ca_data else self.ca_file,
            "cert_file": _held_file(self.cert_data) if self.cert_data else self.cert_file,
            "key_file": _held_file(self.key_data) if self.key_data else self.key_file,
        }
        if self.tls_server_name:
            settings["tls_server_name"] = self.tls_server_name
        if self.proxy:
            settings["proxy"] = self.proxy
        if self.token.value is not None or self.token.path is not None:
            token = self.token

            def refresh(configuration: Any) -> None:
                configuration.api_key["BearerToken"] = f"Bearer {token.get()}"

            refresh_hook: Callable[[Any], None] = refresh
            settings["api_key"] = {"BearerToken": f"Bearer {token.get()}"}
            settings["refresh_api_key_hook"] = refresh_hook
        return settings


def kubeconfig_files(explicit: str | None, env: Mapping[str, str] | None = None) -> list[str]:
    """kubectl's order: ``explicit``, else ``$KUBECONFIG`` (a list), else ``~/.kube/config``;
    the files that exist."""
    environ = os.environ if env is None else env
    files = explicit or environ.get("KUBECONFIG") or str(Path("~/.kube/config").expanduser())
    return [f for f in files.split(os.pathsep) if f and Path(f).expanduser().exists()]


def load(
    kubeconfig: str | None,
    *,
    context: str | None = None,
    discover: bool = False,
    account: Path = SERVICE_ACCOUNT,
    env: Mapping[str, str] | None = None,
) -> ClientConfig:
    """The configuration from the file ``kubeconfig``; when it is None, from the files kubectl
    would read (``discover``), else the pod's service account. ``context`` picks a context other
    than the current one. Raises :class:`KubeconfigError` (:class:`NotFound` when there is none
    at all)."""
    environ = os.environ if env is None else env
    if kubeconfig:
        return _from_files([kubeconfig], context)
    if discover:
        found = kubeconfig_files(None, environ)
        if found:
            return _from_files(found, context)
    return in_cluster(account, environ)


def in_cluster(
    account: Path = SERVICE_ACCOUNT, env: Mapping[str, str] | None = None
) -> ClientConfig:
    """The pod's service account, as every in-cluster client finds it."""
    environ = os.environ if env is None else env
    host = environ.get("KUBERNETES_SERVICE_HOST")
    port = environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise NotFound("in-cluster config: not in a cluster (KUBERNETES_SERVICE_HOST is not set)")
    if ":" in host:
        host = f"[{host}]"
    namespace = account / "namespace"
    return ClientConfig(
        server=f"https://{host}:{port}",
        where="in-cluster config",
        namespace=namespace.read_text().strip() if namespace.exists() else "default",
        ca_file=str(account / "ca.crt"),
        token=Token(path=str(account / "token")),
    )


def namespace(
    kubeconfig: str | None,
    context: str | None = None,
    *,
    account: Path = SERVICE_ACCOUNT,
    env: Mapping[str, str] | None = None,
) -> str:
    """The namespace kubectl would use (the context's; the pod's in a cluster; else
    ``default``): never raises."""
    try:
        return load(kubeconfig, context=context, discover=True, account=account, env=env).namespace
    except (KubeconfigError, OSError):
        return "default"


def _from_files(paths: Sequence[str], context: str | None) -> ClientConfig:
    doc = _merged(paths)
    where = f"kubeconfig {os.pathsep.join(paths)}"
    name = context or str(doc.get("current-context") or "")
    chosen = _pick(doc, where, "contexts", name)
    cluster_name, user_name = str(chosen.get("cluster", "")), str(chosen.get("user", ""))
    cluster = _pick(doc, where, "clusters", cluster_name)
    user = _pick(doc, where, "users", user_name) if user_name else {}
    cluster_at, user_at = f"clusters[{cluster_name!r}].cluster", f"users[{user_name!r}].user"
    if not isinstance(cluster.get("server"), str):
        raise KubeconfigError(f"{where}: {cluster_at}.server is missing")
    needs = [key for key in _CLIENT_ONLY if key in user]

    def data(entry: dict[str, Any], at: str, key: str) -> bytes | None:
        if f"{key}-data" not in entry:
            return None
        try:
            return base64.b64decode(str(entry[f"{key}-data"]), validate=True)
        except (binascii.Error, ValueError):
            raise KubeconfigError(f"{where}: {at}.{key}-data is not valid base64") from None

    def text(entry: dict[str, Any], key: str) -> str | None:
        value = entry.get(key)
        return None if value is None else str(value)

    cert, key = data(user, user_at, "client-certificate"), data(user, user_at, "client-key")
    cert_file, key_file = text(user, "client-certificate"), text(user, "client-key")
    has_cert, has_key = (cert or cert_file) is not None, (key or key_file) is not None
    if not needs and has_cert != has_key:
        raise KubeconfigError(
            f"{where}: {user_at} has a client certificate without its key or a key without "
            "its certificate"
        )
    return ClientConfig(
        server=str(cluster["server"]),
        where=where,
        files=os.pathsep.join(paths),
        context=name or None,
        namespace=str(chosen.get("namespace") or "default"),
        ca_data=data(cluster, cluster_at, "certificate-authority"),
        ca_file=text(cluster, "certificate-authority"),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        tls_server_name=text(cluster, "tls-server-name"),
        proxy=text(cluster, "proxy-url"),
        cert_data=cert,
        cert_file=cert_file,
        key_data=key,
        key_file=key_file,
        token=Token(value=text(user, "token"), path=text(user, "tokenFile")),
        needs_client=f"{where}: {user_at} needs the official client ({needs[0]})"
        if needs
        else None,
        cluster_at=cluster_at,
        user_at=user_at,
    )


def _merged(paths: Sequence[str]) -> dict[str, Any]:
    """The files as one: the first to name an entry, or the current context, wins; relative
    paths are made absolute against each entry's own file."""
    merged: dict[str, Any] = {"contexts": [], "clusters": [], "users": []}
    for path in paths:
        doc = _load_yaml(path)
        if not isinstance(doc, dict):
            raise KubeconfigError(f"kubeconfig {path}: not a kubeconfig (expected a mapping)")
        if doc.get("current-context") and not merged.get("current-context"):
            merged["current-context"] = doc["current-context"]
        base = Path(path).expanduser().resolve().parent
        for section in ("contexts", "clusters", "users"):
            items = doc.get(section) or []
            if not isinstance(items, list):
                raise KubeconfigError(f"kubeconfig {path}: {section} must be a list")
            known = {i.get("name") for i in merged[section]}
            for item in items:
                if isinstance(item, dict) and item.get("name") not in known:
                    merged[section].append(_absolute(item, section.rstrip("s"), base))
    return merged


def _absolute(item: dict[str, Any], kind: str, base: Path) -> dict[str, Any]:
    inner = item.get(kind)
    if not isinstance(inner, dict):
        return item
    fixed = dict(inner)
    for key in _PATHS.get(kind, ()):
        value = fixed.get(key)
        if isinstance(value, str) and value and not os.path.isabs(value):
            fixed[key] = str(base / value)
    return {**item, kind: fixed}


def _load_yaml(path: str) -> Any:
    try:
        text = Path(path).expanduser().read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise KubeconfigError(f"kubeconfig {path}: cannot read it: {reason}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        # PyYAML's message quotes the offending line, which may be a token: say where only.
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise KubeconfigError(f"kubeconfig {path}: not valid YAML{where}") from None


def _pick(doc: dict[str, Any], where: str, section: str, name: str) -> dict[str, Any]:
    """The entry ``name`` of ``section`` (``contexts``, ``clusters``, ``users``)."""
    kind = section.rstrip("s")
    for item in doc.get(section) or []:
        if isinstance(item, dict) and item.get("name") == name:
            found = item.get(kind) or {}
            if not isinstance(found, dict):
                raise KubeconfigError(f"{where}: {section}[{name!r}].{kind} must be a mapping")
            return dict(found)
    raise KubeconfigError(f"{where}: no {kind} named {name!r}")


@contextlib.contextmanager
def _secret_file(data: bytes) -> Iterator[str]:
    """A path from which ``ssl`` can load ``data`` (it loads keys only from files), gone again
    when the block ends: ``load_cert_chain`` reads it at once and keeps the key in memory.

    On Linux the file is a memfd, reached as ``/proc/self/fd/N``: it lives in memory, is never
    on a filesystem, and disappears with the descriptor, so no exit, signal or crash can leave
    the key behind. Elsewhere it is a file in a fresh 0700 folder, removed right after loading.
    """
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("shoal-secret", os.MFD_CLOEXEC)
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


#: The in-memory files handed to the official client, open for the life of the process.
_HELD: list[contextlib.ExitStack] = []


def _held_file(data: bytes) -> str:
    """A path to ``data`` that stays readable for the life of the process (the official client
    reads certificates and keys from paths, at each new connection): a memfd on Linux, else a
    0600 file removed at exit, as the official client's own loader does."""
    stack = contextlib.ExitStack()
    path = stack.enter_context(_secret_file(data))
    _HELD.append(stack)
    atexit.register(stack.close)
    return path


def official_client(config: ClientConfig, client: Any, loader: Any) -> Any:
    """An ApiClient of the official client for ``config``, which the caller hands in (its
    ``kubernetes.client`` and ``kubernetes.config`` modules: this package imports no client
    library). A user only that client can serve (a plugin) is loaded by its own loader, from
    the same files and context."""
    if config.needs_client:
        return loader.new_client_from_config(config_file=config.files, context=config.context)
    settings = client.Configuration()
    for name, value in config.official().items():
        setattr(settings, name, value)
    return client.ApiClient(settings)
