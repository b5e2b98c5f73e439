"""API client construction and the client-side rate limit (QPS and burst, like client-go's)."""

from __future__ import annotations

import threading
import time
from typing import Any

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
