"""API client construction and the client-side rate limit (QPS and burst, like client-go's)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any
from urllib.parse import quote

from kubernetes import client, config


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


def api_client(kubeconfig: str | None, *, pool_size: int = 32) -> Any:
    """An ApiClient from a kubeconfig file, or the in-cluster config when none is given."""
    if kubeconfig:
        api = config.new_client_from_config(config_file=kubeconfig)
    else:
        config.load_incluster_config()
        api = client.ApiClient()
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

    def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any],
        *,
        content_type: str = "application/json",
    ) -> None:
        """Send ``body`` to ``path``; raises :class:`ApiError` on an error status."""
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
        if 200 <= response.status < 300:
            return
        try:
            message = str(json.loads(data).get("message", ""))
        except (TypeError, ValueError):
            message = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
        raise ApiError(int(response.status), str(response.reason), message[:300])


def pod_path(namespace: str, name: str, sub: str = "") -> str:
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"
    return f"{path}/{sub}" if sub else path
