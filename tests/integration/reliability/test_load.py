"""Load on a control plane of the module's own: 5,000 pending pods and a node added and another
removed every second, for a sustained period. The scheduler's memory stays flat (the slope of its
resident memory is a figure), its queues stay bounded by the pods that wait, no GPU is
over-committed and no gang is placed below its minimum."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from contracts import names
from devcluster import cluster, nodes
from scheduler.k8s.client import Rest
from tests import figures
from tests.integration.conftest import Devcluster
from tests.integration.reliability.owncluster import (
    check_bindings,
    events,
    metrics,
    own_devcluster,
    rss_mib,
    slope_per_minute,
)
from tests.integration.scheduler.conftest import (
    KWOK_TOLERATION,
    TEST_LABEL,
    Pods,
    Pool,
    SchedulerProcess,
)

pytestmark = pytest.mark.reliability

SECTION = "load"
PENDING = 5000
GANG = 5
GPUS = 8
#: Seconds of churn (a node added and the oldest removed every second) after the pods exist.
CHURN_SECONDS = 75
ALIVE = 6
SAMPLE_EVERY = 3.0


@pytest.fixture(scope="module")
def devcluster(tmp_path_factory: pytest.TempPathFactory, bin_dir: Path) -> Iterator[Devcluster]:
    """This module's own control plane: 5,000 pods are too many to leave in the shared one."""
    options = cluster.Options(die_with_parent=True)
    yield from own_devcluster(tmp_path_factory.mktemp("load"), bin_dir, options)


def pod_body(pods: Pods, gang: str, index: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{gang}-{index}",
            "labels": {names.GANG_LABEL: gang},
            "annotations": {names.MIN_MEMBER_ANNOTATION: str(GANG)},
        },
        "spec": {
            "schedulerName": pods.scheduler,
            "tolerations": [KWOK_TOLERATION],
            "nodeSelector": {TEST_LABEL: pods.pool},
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "worker",
                    "image": "registry.example/trainer:1",
                    "resources": {"limits": {names.GPU_RESOURCE: "1", "cpu": "1"}},
                }
            ],
        },
    }


def create_pending(devcluster: Devcluster, pods: Pods) -> None:
    rest = Rest(devcluster.api)
    path = f"/api/v1/namespaces/{pods.namespace}/pods"
    bodies = [pod_body(pods, f"g{g:04d}", i) for g in range(PENDING // GANG) for i in range(GANG)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda body: rest.call("POST", path, body), bodies))


class Churn:
    """A node of the test's pool added every second and, past ``ALIVE``, the oldest removed."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.alive: list[str] = []
        self.added = 0
        self.removed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="churn", daemon=True)

    def _run(self) -> None:
        core = self.pool.devcluster.core()
        while not self._stop.wait(1.0):
            spec = nodes.NodeSpec(count=1, gpus=GPUS, prefix=f"{self.pool.pool}-c{self.added}")
            self.alive.append(self.pool.add_manifest(nodes.node_manifest(spec, 0)))
            self.added += 1
            while len(self.alive) > ALIVE:
                try:
                    core.delete_node(self.alive.pop(0))
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                self.removed += 1

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def test_5000_pending_pods_and_node_churn_keep_memory_flat_and_queues_bounded(
    devcluster: Devcluster,
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
) -> None:
    pool.add(2, gpus=GPUS, prefix="base")
    scheduler = start_scheduler()
    assert scheduler.proc is not None
    pid = scheduler.proc.pid
    started = time.monotonic()
    create_pending(devcluster, pods)
    created_in = time.monotonic() - started

    churn = Churn(pool)
    samples: list[tuple[float, float]] = []
    gauges: dict[str, float] = {}
    begun = time.monotonic()
    churn.start()
    try:
        while time.monotonic() - begun < CHURN_SECONDS:
            assert scheduler.proc.poll() is None, "the scheduler exited under load"
            samples.append((time.monotonic() - begun, rss_mib(pid)))
            seen = metrics(scheduler)
            for name in (
                "shoal_scheduler_queue_entries",
                "shoal_scheduler_pending_gangs",
                "shoal_scheduler_status_backlog",
                "shoal_scheduler_cached_pods",
                "shoal_scheduler_binds_in_flight",
            ):
                gauges[name] = max(gauges.get(name, 0.0), seen[name])
            time.sleep(SAMPLE_EVERY)
    finally:
        churn.stop()

    assert scheduler.proc.poll() is None
    assert len(events(scheduler, "started")) == 1
    # Bounded by the pods that wait: nothing queues up beyond them.
    assert gauges["shoal_scheduler_queue_entries"] <= PENDING // GANG
    assert gauges["shoal_scheduler_pending_gangs"] <= PENDING // GANG
    assert gauges["shoal_scheduler_cached_pods"] <= PENDING + 100
    assert gauges["shoal_scheduler_status_backlog"] <= 5000
    # No GPU over-committed on the nodes that exist; no gang placed below its minimum.
    check_bindings(devcluster, pods.namespace, GPUS)
    cycles = [c for c in events(scheduler, "cycle") if c["placed_min"]]
    short = [c for c in cycles if c["bound"] + c["placed_min"] < c["min"]]
    assert not short, f"gangs placed below their minimum: {short[:3]}"
    placed = sum(c["placed_min"] + c["placed_surplus"] for c in cycles)

    second_half = [s for s in samples if s[0] >= CHURN_SECONDS / 2]
    slope = slope_per_minute(second_half)
    figures.record(SECTION, "pending pods", PENDING)
    figures.record(SECTION, "seconds to create them", round(created_in, 1))
    figures.record(SECTION, "churn seconds", CHURN_SECONDS)
    figures.record(SECTION, "nodes churned (added/removed)", f"{churn.added}/{churn.removed}")
    figures.record(SECTION, "pods placed during churn", placed)
    figures.record(SECTION, "rss samples", len(samples))
    figures.record(SECTION, "rss first MiB", round(samples[0][1], 1))
    figures.record(SECTION, "peak rss MiB", round(max(v for _, v in samples), 1))
    figures.record(SECTION, "rss slope MiB/min (second half)", round(slope, 2))
    for name, value in gauges.items():
        figures.record(SECTION, f"max {name.removeprefix('shoal_scheduler_')}", value)
    # Generous: a leak proportional to the churn or the pods would be far steeper.
    assert slope < 20, f"the scheduler's memory grows {slope:.1f} MiB/min under steady load"
