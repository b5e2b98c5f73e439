"""What the API-server and load tests share: a control plane of their own, gangs created from a
thread while faults happen, the checks every gang must pass afterwards, and the scheduler's
metrics and memory as numbers.

A test module that restarts or loads the API server must not do it to the session's devcluster
(other tests use it); it overrides the ``devcluster`` fixture with :func:`own_devcluster`, and the
scheduler fixtures (``pool``, ``pods``, ``start_scheduler``) then run against its own cluster.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import config
from kubernetes.client.exceptions import ApiException

from contracts import names
from devcluster import cluster, process
from tests.integration.conftest import Devcluster
from tests.integration.scheduler.conftest import Pods, SchedulerProcess


def own_devcluster(run_dir: Path, bin_dir: Path, options: cluster.Options) -> Iterator[Devcluster]:
    handle = cluster.up(run_dir, bin_dir, options)
    api = config.new_client_from_config(config_file=str(handle.kubeconfig))
    try:
        yield Devcluster(handle=handle, api=api)
    finally:
        api.close()
        cluster.down(run_dir)
        if os.environ.get("SHOAL_KEEP_LOGS"):
            print(f"devcluster logs kept in {run_dir / 'logs'}")


@dataclass
class GangMaker:
    """Creates gangs (``size`` pods of ``gpus`` GPUs each, min = size) on a thread, one every
    ``interval`` seconds, tagging each with the phase it was created in. A create the API server
    does not answer is retried until it is answered: 409 (it did get through) counts as made."""

    pods: Pods
    size: int = 3
    gpus: int = 1
    interval: float = 0.3
    #: The thread makes no more than this many gangs in all (so that every gang can fit).
    limit: int = 1000
    phase: str = "before"
    made: dict[str, tuple[str, list[str]]] = field(default_factory=dict)  # gang -> phase, pods
    errors: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def one(self) -> str:
        gang = f"g{len(self.made):03d}-{uuid.uuid4().hex[:4]}"
        members = [f"{gang}-{i}" for i in range(self.size)]
        self.made[gang] = (self.phase, members)
        for name in members:
            self._create(gang, name)
        return gang

    def _create(self, gang: str, name: str) -> None:
        while True:
            try:
                self.pods.create(
                    name,
                    gpus=self.gpus,
                    labels={names.GANG_LABEL: gang},
                    annotations={names.MIN_MEMBER_ANNOTATION: str(self.size)},
                )
                return
            except ApiException as exc:
                if exc.status == 409:
                    return
                self.errors += 1
            except Exception:  # connection refused or reset while the API server is down
                self.errors += 1
            time.sleep(0.2)

    def start(self) -> GangMaker:
        def loop() -> None:
            while not self._stop.is_set() and len(self.made) < self.limit:
                self.one()
                self._stop.wait(self.interval)

        self._thread = threading.Thread(target=loop, name="gang-maker", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)

    def by_phase(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for phase, _ in self.made.values():
            counts[phase] = counts.get(phase, 0) + 1
        return counts


def check_bindings(devcluster: Devcluster, namespace: str, gpus_per_node: int) -> dict[str, str]:
    """No node holds more GPUs than it has; returns pod -> node for every bound pod."""
    # Raw JSON: the client's model classes for thousands of pods cost seconds of CPU.
    response = devcluster.core().list_namespaced_pod(namespace, _preload_content=False)
    used: dict[str, int] = {}
    bound: dict[str, str] = {}
    for pod in json.loads(response.data)["items"]:
        node = pod["spec"].get("nodeName")
        if not node:
            continue
        bound[pod["metadata"]["name"]] = node
        limits = pod["spec"]["containers"][0].get("resources", {}).get("limits") or {}
        used[node] = used.get(node, 0) + int(limits.get(names.GPU_RESOURCE, "0"))
    over = {node: n for node, n in used.items() if n > gpus_per_node}
    assert not over, f"GPUs over-committed: {over}"
    return bound


def gangs_whole(made: dict[str, tuple[str, list[str]]], bound: dict[str, str]) -> list[str]:
    """Gangs with every member bound; fails on any gang bound partly (min = size: all or none)."""
    whole = []
    for gang, (_, members) in made.items():
        count = sum(1 for m in members if m in bound)
        assert count in (0, len(members)), f"gang {gang} is partly bound: {count}/{len(members)}"
        if count == len(members):
            whole.append(gang)
    return whole


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def metrics(scheduler: SchedulerProcess) -> dict[str, float]:
    """The scheduler's /metrics as ``name{labels}`` -> value."""
    status, text = scheduler.get("/metrics")
    assert status == 200
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            out[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return out


def events(scheduler: SchedulerProcess, name: str) -> list[dict[str, Any]]:
    return [line for line in scheduler.log_lines() if line.get("event") == name]


def rss_mib(pid: int) -> float:
    kib = process.status_kib(pid, "VmRSS")
    if kib is None:
        raise AssertionError(f"no VmRSS for {pid}")
    return kib / 1024


def slope_per_minute(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) samples, per minute."""
    n = len(samples)
    if n < 2:
        return 0.0
    mean_t = sum(t for t, _ in samples) / n
    mean_v = sum(v for _, v in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (v - mean_v) for t, v in samples)
    return cov / var * 60.0
