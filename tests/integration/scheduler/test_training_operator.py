"""The real Kubeflow training-operator (v1.8.1, built from its Go module) in scheduler-plugins
gang mode, pointed at a Shoal scheduler: the PodGroups, labels and scheduler names it writes are
what Shoal schedules from. The jobs are the examples in ``manifests/examples/``, moved into the
test's namespace and node pool.

What the operator really writes (asserted below): a PodGroup named after the job, owned by it,
with the job's annotations; ``spec.minMember`` = ``runPolicy.schedulingPolicy.minAvailable``, else
every replica (the launcher included for an MPIJob; ``elasticPolicy.minReplicas`` is not used);
``spec.minResources`` for that many pods; on each pod the label ``scheduling.x-k8s.io/pod-group``
and, where the template names no scheduler, ``schedulerName`` = ``--gang-scheduler-name``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from contracts import names
from tests.integration.conftest import Devcluster
from tests.integration.history import History, State
from tests.integration.scheduler import training_operator
from tests.integration.scheduler.conftest import (
    KWOK_TOLERATION,
    TEST_LABEL,
    Pods,
    Pool,
    SchedulerProcess,
    ensure_priority_class,
)
from tests.integration.scheduler.training_operator import TrainingOperator
from tests.waiting import eventually

EXAMPLES = Path(__file__).resolve().parents[3] / "manifests" / "examples"
KUBEFLOW = ("kubeflow.org", "v1")
PODGROUPS = ("scheduling.x-k8s.io", "v1alpha1", "podgroups")
#: Every status field of the published PodGroup schema.
STATUS_FIELDS = {"phase", "occupiedBy", "running", "succeeded", "failed", "scheduleStartTime"}

pytestmark = pytest.mark.usefixtures("pod_group_crd", "kubeflow_crds")


@pytest.fixture(scope="session")
def kubeflow_crds(devcluster: Devcluster) -> None:
    training_operator.apply_crds(devcluster)


@pytest.fixture
def operator(pods: Pods, tmp_path: Path) -> Iterator[TrainingOperator]:
    """The operator for the test's namespace, its gang scheduler the test's Shoal."""
    running = TrainingOperator(pods.devcluster, pods.namespace, pods.scheduler, tmp_path)
    try:
        yield running.start()
    finally:
        running.stop()


def _example(name: str, pods: Pods, pool: Pool) -> Any:
    """The example job in the test's namespace, on the test's nodes; a scheduler the example
    names becomes the test's."""
    [job] = yaml.safe_load_all((EXAMPLES / name).read_text())
    job["metadata"]["namespace"] = pods.namespace
    replicas = job["spec"].get("pytorchReplicaSpecs") or job["spec"]["mpiReplicaSpecs"]
    for replica in replicas.values():
        spec = replica["template"]["spec"]
        spec["nodeSelector"] = {TEST_LABEL: pool.pool}
        spec["tolerations"] = [KWOK_TOLERATION]
        spec["terminationGracePeriodSeconds"] = 0
        if "schedulerName" in spec:
            spec["schedulerName"] = pods.scheduler
    return job


def _submit(pods: Pods, plural: str, job: dict[str, Any]) -> None:
    client.CustomObjectsApi(pods.devcluster.api).create_namespaced_custom_object(
        *KUBEFLOW, pods.namespace, plural, job
    )


def _pod_group(pods: Pods, name: str) -> dict[str, Any] | None:
    custom = client.CustomObjectsApi(pods.devcluster.api)
    try:
        found: dict[str, Any] = custom.get_namespaced_custom_object(
            PODGROUPS[0], PODGROUPS[1], pods.namespace, PODGROUPS[2], name
        )
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return found


def _members(pods: Pods, group: str) -> list[Any]:
    """The live pods the operator made for ``group`` (not those on their way out)."""
    return [
        p
        for p in pods.all()
        if (p.metadata.labels or {}).get(names.POD_GROUP_LABEL) == group
        and p.metadata.deletion_timestamp is None
    ]


def _bound(pods: Pods, group: str) -> list[str]:
    return sorted(p.metadata.name for p in _members(pods, group) if p.spec.node_name)


def _status(pods: Pods, group: str, **expected: object) -> dict[str, Any] | None:
    found = (_pod_group(pods, group) or {}).get("status") or {}
    return found if all(found.get(k) == v for k, v in expected.items()) else None


def _waiting(pods: Pods, name: str) -> str | None:
    condition = pods.condition(name)
    if condition is None or condition.status != "False":
        return None
    return str(condition.message)


def test_elastic_pytorch_job_admitted_at_its_minimum_grown_to_its_maximum_shrunk_by_reclaim(
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    operator: TrainingOperator,
    pod_history: History,
) -> None:
    ensure_priority_class(pods.devcluster, "shoal-test-high", 100000)
    pool.add(1, gpus=8)  # room for one 8-GPU worker of a gang whose minimum is two
    job = _example("pytorchjob-podgroup.yaml", pods, pool)
    name = job["metadata"]["name"]
    start_scheduler("--reclaim-grace", "3")
    _submit(pods, "pytorchjobs", job)

    group = eventually(lambda: _pod_group(pods, name), what="the operator's PodGroup")
    assert group["spec"]["minMember"] == 2  # runPolicy.schedulingPolicy.minAvailable
    assert group["spec"]["minResources"][names.GPU_RESOURCE] == "16"
    [owner] = group["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("PyTorchJob", name, True)
    assert group["metadata"]["annotations"] == job["metadata"]["annotations"]
    workers = eventually(
        lambda: _members(pods, name) if len(_members(pods, name)) == 4 else None,
        what="the operator's four worker pods",
    )
    assert {p.spec.scheduler_name for p in workers} == {pods.scheduler}

    # Room for one: not one worker runs alone. They are told why they wait, in the terms of the
    # zone the job's annotation (copied to the PodGroup by the operator) requires.
    why = "no single topology.kubernetes.io/zone has room for all 2 member(s)"
    first = workers[0].metadata.name
    eventually(lambda: why in (_waiting(pods, first) or ""), what="a worker told why it waits")
    assert eventually(lambda: _status(pods, name, phase="Scheduling", running=0), what="waiting")
    assert _bound(pods, name) == []

    # Room for two: the minimum, together.
    pool.add(1, gpus=8, prefix="second")
    eventually(lambda: _status(pods, name, phase="Running", running=2), what="phase Running, 2")
    assert len(_bound(pods, name)) == 2

    # Room for four: grown to the maximum, the four pods the operator made.
    pool.add(2, gpus=8, prefix="more")
    found = eventually(lambda: _status(pods, name, phase="Running", running=4), what="running 4")
    assert set(found) <= STATUS_FIELDS
    assert len(_bound(pods, name)) == 4

    # A more urgent gang takes the surplus: two workers are reclaimed, never the minimum; the
    # operator replaces them, and the replacements wait.
    urgent = pods.gang("urgent", 2, gpus=8, min_member=2, priority_class="shoal-test-high")
    eventually(lambda: len(pods.bound(urgent)) == 2, what="the urgent gang in the reclaimed room")
    eventually(lambda: _status(pods, name, phase="Running", running=2), what="shrunk to 2")
    eventually(lambda: len(_members(pods, name)) == 4, what="the operator's replacements")
    assert len(_bound(pods, name)) == 2

    # From every version of the pods since the job ran at four, not from samples of them.
    def bound(state: State) -> int:
        return len(
            [
                p
                for p in state.values()
                if (p.metadata.labels or {}).get(names.POD_GROUP_LABEL) == name
                and p.metadata.deletion_timestamp is None
                and p.spec.node_name
            ]
        )

    assert pod_history.lowest(bound, since=lambda state: bound(state) == 4) >= 2
    reclaimed = [
        e
        for p in workers
        for e in pods.events(p.metadata.name)
        if e.reason == "Reclaimed" and e.involved_object.uid == p.metadata.uid
    ]
    assert len(reclaimed) == 2
    assert all("to make room for gang" in e.message for e in reclaimed)


def test_mpi_job_launcher_and_workers_are_admitted_together_never_partly(
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    operator: TrainingOperator,
) -> None:
    pool.add(1, gpus=8)  # room for the launcher and one worker, not both workers
    job = _example("mpijob.yaml", pods, pool)
    name = job["metadata"]["name"]
    start_scheduler()
    _submit(pods, "mpijobs", job)

    group = eventually(lambda: _pod_group(pods, name), what="the operator's PodGroup")
    assert group["spec"]["minMember"] == 3  # every replica: the launcher and both workers
    members = eventually(
        lambda: _members(pods, name) if len(_members(pods, name)) == 3 else None,
        what="the launcher and both workers",
    )
    roles = sorted(p.metadata.labels["training.kubeflow.org/replica-type"] for p in members)
    assert roles == ["launcher", "worker", "worker"]
    assert {p.spec.scheduler_name for p in members} == {pods.scheduler}

    launcher = next(p.metadata.name for p in members if p.metadata.name.endswith("-launcher"))
    eventually(lambda: _waiting(pods, launcher), what="the launcher told why it waits")
    eventually(lambda: _status(pods, name, phase="Scheduling", running=0), what="waiting")
    assert _bound(pods, name) == []  # the launcher and one worker would fit: neither is bound

    pool.add(1, gpus=8, prefix="second")
    eventually(lambda: _status(pods, name, phase="Running", running=3), what="all three running")
    assert len(_bound(pods, name)) == 3
    # The templates name the scheduler, so v1.8.1's inverted check has nothing to warn about
    # (without the names it records "Another scheduler is specified ..." on the MPIJob).
    said = [e.message for e in pods.events(name) if e.involved_object.kind == "MPIJob"]
    assert not [m for m in said if "Another scheduler is specified" in m]
