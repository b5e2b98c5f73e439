"""API client construction, the client-side rate limit (QPS and burst, like client-go's), and the
fence on a leader's writes."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import structlog
from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from common import kubeconfig

log = structlog.get_logger("scheduler.api")


class TokenBucket:
    """``qps`` requests per second on average, up to ``burst`` at once. Thread-safe.

    ``qps <= 0`` disables the limit (as kube-scheduler's benchmarks run).
    """

    def __init__(self, qps: float, burst: int) -> None:
        self.qps = qps
        self.burst = max(1, burst)
        self._tokens = float(self.burst)
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def acquire(self) -> None:
        if self.qps <= 0:
            return
        while True:
            with self._lock:
                now = time.monotonic()
                self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
                self._last = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                wait = (1 - self._tokens) / self.qps
            time.sleep(wait)


#: The kubeconfig (or in-cluster config) cannot be used; the message names the file and where in
#: it, never a value (:mod:`common.kubeconfig`).
KubeconfigError = kubeconfig.KubeconfigError


def api_client(kubeconfig_file: str | None, *, pool_size: int = 32) -> Any:
    """An ApiClient from a kubeconfig file, or the in-cluster config when none is given (read
    by :mod:`common.kubeconfig`); :class:`KubeconfigError` when it cannot be loaded."""
    where = f"kubeconfig {kubeconfig_file}" if kubeconfig_file else "in-cluster config"
    try:
        api = kubeconfig.official_client(kubeconfig.load(kubeconfig_file), client, config)
    except KubeconfigError:
        raise
    except OSError as exc:
        named = f": {exc.filename}" if exc.filename else ""
        raise KubeconfigError(f"{where}: {exc.strerror or type(exc).__name__}{named}") from None
    except ConfigException as exc:
        # The official loader (for a credential plugin) names keys and entries, not values.
        raise KubeconfigError(f"{where}: {exc}") from None
    except Exception as exc:
        # Anything else may carry a value it choked on (a token, a key): its kind only.
        raise KubeconfigError(f"{where}: cannot be used ({type(exc).__name__})") from None
    api.configuration.connection_pool_maxsize = pool_size
    api.rest_client.pool_manager.connection_pool_kw["maxsize"] = pool_size
    return api


class ApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotLeader(ApiError):
    """A write refused before it left: this replica cannot be sure it holds the leader's Lease
    (``scheduler/k8s/lease.py``). Nothing reached the API server."""

    def __init__(self, why: str) -> None:
        super().__init__(0, "NotLeader", why)

    def __str__(self) -> str:
        return f"not sent, not the leader: {self.message}"


#: Why a write may not leave now, or ``None`` when it may (``LeaderElector.refusal``).
Fence = Callable[[], "str | None"]

#: Requests that change nothing, which the fence lets through.
_READS = frozenset({"GET", "HEAD", "OPTIONS"})


class FencedApi:
    """What :class:`Rest` uses of an ApiClient (its host, credentials and connection pool), with
    every request other than a read refused with :class:`NotLeader` unless ``fence`` allows it
    at the moment it would leave: after any wait for the rate limiter, with nothing left to do
    but send. Only :class:`Rest` is built on it; the generated API classes need more of an
    ApiClient, and fail on this one at once instead of writing unfenced."""

    def __init__(self, api: Any, fence: Fence) -> None:
        self.configuration = api.configuration
        self.update_params_for_auth = api.update_params_for_auth
        self.rest_client = _FencedRestClient(api.rest_client, fence)


class _FencedRestClient:
    def __init__(self, inner: Any, fence: Fence) -> None:
        self._inner = inner
        self._fence = fence

    def request(self, method: str, url: str, **kwargs: Any) -> Any:
        if method.upper() not in _READS:
            why = self._fence()
            if why is not None:
                raise NotLeader(why)
        return self._inner.request(method, url, **kwargs)


class Rest:
    """JSON requests through the official client's connection pool and authentication.

    The generated methods validate and convert every argument and response; for the few
    writes the scheduler makes per pod that costs about five times the CPU of the request
    itself, and the writes are what limit scheduling throughput. Bodies are plain dicts.
    """

    def __init__(self, api: Any, *, timeout: float = 30.0) -> None:
        self._api = api
        self._host = str(api.configuration.host).rstrip("/")
        self._timeout = timeout

    def get(self, path: str) -> dict[str, Any]:
        """The object at ``path``; raises :class:`ApiError` on an error status."""
        try:
            found = json.loads(self._request("GET", path, None, "application/json"))
        except ValueError:
            return {}
        return found if isinstance(found, dict) else {}

    def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any],
        *,
        content_type: str = "application/json",
    ) -> None:
        """Send ``body`` to ``path``; raises :class:`ApiError` on an error status."""
        self._request(method, path, body, content_type)

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None, content_type: str
    ) -> bytes:
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        # The same credentials as the generated client (a bearer token is refreshed there).
        self._api.update_params_for_auth(headers, [], ["BearerToken"], path, method, body)
        response = self._api.rest_client.request(
            method, self._host + path, headers=headers, body=body, _request_timeout=self._timeout
        )
        try:
            data = response.read()
        finally:
            response.response.release_conn()
        warning = response.headers.get("Warning")
        if warning:
            # The API server accepted the write but says something about it (a field the
            # schema prunes, a deprecated API): worth a line in the log, not a failure.
            log.warning("api_warning", method=method, path=path, warning=str(warning)[:300])
        if 200 <= response.status < 300:
            return data if isinstance(data, bytes) else str(data).encode()
        try:
            message = str(json.loads(data).get("message", ""))
        except (TypeError, ValueError):
            message = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
        raise ApiError(int(response.status), str(response.reason), message[:300])


def pod_path(namespace: str, name: str, sub: str = "") -> str:
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"
    return f"{path}/{sub}" if sub else path
