"""Fixtures for the scheduler against the devcluster: the PodGroup CRD, a scheduler process per
test (its own ``--scheduler-name``), and GPU nodes that only the test's pods select."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from contracts import gputopology, names
from devcluster import nodes
from devcluster.ports import free_port
from tests.integration.conftest import Devcluster
from tests.waiting import STARTS_WITHIN, eventually

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[3]
CRD = ROOT / "manifests" / "crds" / "scheduling.x-k8s.io_podgroups.yaml"
VOLCANO_CRD = Path(__file__).with_name("crds") / "scheduling.volcano.sh_podgroups.yaml"
TEST_LABEL = "shoal.dev/test-pool"
KWOK_TOLERATION = {
    "key": names.KWOK_TAINT,
    "operator": "Equal",
    "value": names.KWOK_NODE_VALUE,
    "effect": "NoSchedule",
}


@pytest.fixture(scope="session")
def pod_group_crd(devcluster: Devcluster) -> None:
    """The PodGroup CRD as scheduler-plugins publishes it (our copy is that file, see
    ``tests/unit/scheduler/test_pod_group_crd.py``), replacing any other version installed."""
    apply_crd(devcluster, CRD)


@pytest.fixture(scope="session")
def volcano_crd(devcluster: Devcluster) -> None:
    """Volcano's PodGroup CRD as Volcano publishes it."""
    apply_crd(devcluster, VOLCANO_CRD)


def apply_crd(devcluster: Devcluster, path: Path) -> None:
    """Create the CRD in ``path``, or replace the one installed, and wait until it serves."""
    ext = client.ApiextensionsV1Api(devcluster.api)
    body = yaml.safe_load(path.read_text())
    try:
        ext.create_custom_resource_definition(body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        current = ext.read_custom_resource_definition(body["metadata"]["name"])
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(body["metadata"]["name"], body)

    def established() -> bool:
        crd = ext.read_custom_resource_definition(body["metadata"]["name"])
        return any(
            c.type == "Established" and c.status == "True" for c in crd.status.conditions or []
        )

    eventually(established, what=f"the CRD {body['metadata']['name']} to be established")


def ensure_priority_class(devcluster: Devcluster, name: str, value: int) -> None:
    scheduling = client.SchedulingV1Api(devcluster.api)
    try:
        scheduling.create_priority_class({"metadata": {"name": name}, "value": value})
    except ApiException as exc:
        if exc.status != 409:
            raise


@dataclass
class SchedulerProcess:
    """``python -m scheduler`` as a user runs it, with its own name and log file."""

    kubeconfig: str
    name: str
    log_dir: Path
    extra: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    logs: list[Path] = field(default_factory=list)

    def start(self, *, wait: bool = True) -> SchedulerProcess:
        """Start the process; with ``wait`` (the default) return once /readyz answers 200."""
        self.port = free_port()
        path = self.log_dir / f"{self.name}-{uuid.uuid4().hex[:6]}.log"
        self.logs.append(path)
        log = path.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "scheduler",
                "--kubeconfig",
                self.kubeconfig,
                "--scheduler-name",
                self.name,
                "--http-host",
                "127.0.0.1",
                "--http-port",
                str(self.port),
                "--log-format",
                "json",
                "--max-backoff",
                "2",
                *self.extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.close()
        if wait:
            eventually(
                lambda: self.get("/readyz")[0] == 200,
                timeout=STARTS_WITHIN,
                what=f"{self.name} /readyz",
            )
        return self

    def get(self, path: str) -> tuple[int, str]:
        assert self.proc is not None
        if self.proc.poll() is not None:
            pytest.fail(f"scheduler exited with {self.proc.returncode}; see {self.log_dir}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()
        except OSError:
            return 0, ""

    def kill(self) -> None:
        """SIGKILL: no chance to finish anything in flight."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stop(self) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        return int(self.proc.returncode)

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for path in self.logs:
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    lines.append(json.loads(line))
        return lines


@pytest.fixture
def scheduler_name() -> str:
    return f"shoal-test-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def start_scheduler(
    devcluster: Devcluster, scheduler_name: str, tmp_path: Path
) -> Iterator[Callable[..., SchedulerProcess]]:
    started: list[SchedulerProcess] = []

    def start(*extra: str, name: str | None = None, wait: bool = True) -> SchedulerProcess:
        proc = SchedulerProcess(
            devcluster.kubeconfig, name or scheduler_name, tmp_path, extra=list(extra)
        )
        started.append(proc)
        return proc.start(wait=wait)

    yield start
    for proc in started:
        proc.stop()


@dataclass
class Pool:
    """GPU nodes that belong to one test: they carry ``TEST_LABEL=<pool>``."""

    devcluster: Devcluster
    pool: str
    created: list[str] = field(default_factory=list)

    def add(self, count: int, *, prefix: str = "n", **spec: Any) -> list[str]:
        extra = {TEST_LABEL: self.pool, **spec.pop("extra_labels", {})}
        node_spec = nodes.NodeSpec(
            count=count, prefix=f"{self.pool}-{prefix}", extra_labels=extra, **spec
        )
        made = nodes.create(self.devcluster.kubeconfig, node_spec, workers=4)
        self.created.extend(made)
        return made

    def add_manifest(self, body: dict[str, Any]) -> str:
        body["metadata"]["labels"][TEST_LABEL] = self.pool
        self.devcluster.core().create_node(body)
        name = str(body["metadata"]["name"])
        self.created.append(name)
        return name

    def node_with_allocated(
        self, name: str, allocated: dict[int, str], *, island_size: int = 4
    ) -> dict[str, Any]:
        """A node manifest whose topology says these GPUs are already taken."""
        spec = nodes.NodeSpec(count=1, prefix=f"{self.pool}-{name}", island_size=island_size)
        body = nodes.node_manifest(spec, 0)
        topo = gputopology.decode(body["metadata"]["annotations"][names.GPU_TOPOLOGY_ANNOTATION])
        topo = gputopology.GpuTopology(gpus=topo.gpus, links=topo.links, allocated=allocated)
        body["metadata"]["annotations"][names.GPU_TOPOLOGY_ANNOTATION] = gputopology.encode(topo)
        return body

    def delete(self) -> None:
        core = self.devcluster.core()
        for name in self.created:
            try:
                core.delete_node(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise


@pytest.fixture
def pool(devcluster: Devcluster) -> Iterator[Pool]:
    p = Pool(devcluster, f"p{uuid.uuid4().hex[:6]}")
    yield p
    p.delete()


@dataclass
class Pods:
    """Creates the test's pods: its scheduler, its node pool, the kwok toleration."""

    devcluster: Devcluster
    namespace: str
    scheduler: str
    pool: str

    def create(
        self,
        name: str,
        *,
        gpus: int = 1,
        cpu: str = "1",
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        priority_class: str | None = None,
        scheduler: str | None = None,
        pod_group: str | None = None,
    ) -> str:
        """Create one pod; ``pod_group`` names the Kubernetes PodGroup it belongs to
        (``spec.schedulingGroup``)."""
        spec: dict[str, Any] = {
            "schedulerName": scheduler or self.scheduler,
            "tolerations": [KWOK_TOLERATION],
            "nodeSelector": {TEST_LABEL: self.pool},
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "worker",
                    "image": "registry.example/trainer:1",
                    "resources": {"limits": {names.GPU_RESOURCE: str(gpus), "cpu": cpu}},
                }
            ],
        }
        if priority_class:
            spec["priorityClassName"] = priority_class
        if pod_group:
            spec["schedulingGroup"] = {"podGroupName": pod_group}
        body = {
            "metadata": {
                "name": name,
                "labels": labels or {},
                "annotations": annotations or {},
            },
            "spec": spec,
        }
        self.devcluster.core().create_namespaced_pod(self.namespace, body)
        return name

    def gang(
        self,
        gang: str,
        count: int,
        *,
        gpus: int = 1,
        min_member: int | str | None = None,
        max_member: int | str | None = None,
        annotations: dict[str, str] | None = None,
        priority_class: str | None = None,
    ) -> list[str]:
        notes = dict(annotations or {})
        if min_member is not None:
            notes[names.MIN_MEMBER_ANNOTATION] = str(min_member)
        if max_member is not None:
            notes[names.MAX_MEMBER_ANNOTATION] = str(max_member)
        return [
            self.create(
                f"{gang}-{i}",
                gpus=gpus,
                labels={names.GANG_LABEL: gang},
                annotations=notes,
                priority_class=priority_class,
            )
            for i in range(count)
        ]

    def read(self, name: str) -> Any:
        return self.devcluster.core().read_namespaced_pod(name, self.namespace)

    def all(self) -> list[Any]:
        return list(self.devcluster.core().list_namespaced_pod(self.namespace).items)

    def node_of(self, name: str) -> str | None:
        return self.read(name).spec.node_name  # type: ignore[no-any-return]

    def bound(self, names_: list[str]) -> dict[str, str]:
        found = {}
        for pod in self.all():
            if pod.metadata.name in names_ and pod.spec.node_name:
                found[pod.metadata.name] = pod.spec.node_name
        return found

    def condition(self, name: str) -> Any:
        for c in self.read(name).status.conditions or []:
            if c.type == "PodScheduled":
                return c
        return None

    def events(self, name: str) -> list[Any]:
        items = self.devcluster.core().list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name}"
        )
        return list(items.items)

    def delete(self, names_: list[str]) -> None:
        for name in names_:
            self.devcluster.core().delete_namespaced_pod(
                name, self.namespace, grace_period_seconds=0
            )


@pytest.fixture
def pods(devcluster: Devcluster, namespace: str, scheduler_name: str, pool: Pool) -> Pods:
    return Pods(devcluster, namespace, scheduler_name, pool.pool)
