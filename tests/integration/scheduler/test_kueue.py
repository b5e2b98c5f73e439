"""Shoal under the real Kueue (v0.17.0, built from its Go module; ``tests/integration/kueue.py``):
Kueue decides which gangs may use how much of a ClusterQueue's quota, Shoal where their pods go.

Kueue holds a Job it has not admitted suspended (so it has no pods), and a plain pod it has not
admitted behind its scheduling gate (``kueue.x-k8s.io/admission``); Shoal must bind nothing
beyond what Kueue admitted and never a gated pod. The Jobs here are gangs by Shoal's own label;
Kueue's pod groups are gangs by Kueue's label and count (``scheduler/gang/sources/kueue.py``).
Every test runs a ResourceFlavor (selecting the test's nodes), a ClusterQueue and a LocalQueue in
the test's namespace; the node pool has more room than the quota, so the quota is what holds
gangs back (and, in the pod-group test, one node's room).

GPUs held, as counted against the quota: those of pods bound, not finished and not being deleted
(Kueue releases an evicted workload's quota once its Job has no active pods; pods already being
deleted are on their way out, as they are for Kueue).

The module runs on a control plane of its own: Kueue's webhooks fail closed and gate the pods of
every namespace it manages, so no other test's cluster has them."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from contracts import names
from tests.integration import kueue
from tests.integration.history import History, State

# The module's own control plane with Kueue, its namespaces and queues (pytest fixtures).
from tests.integration.kueue import (  # noqa: F401
    Queues,
    kueue_devcluster,
    kueue_namespace,
    kueue_queues,
    kueue_running,
    kueue_webhook_network,
    kueue_workload_history,
)
from tests.integration.scheduler.conftest import Pods, Pool, SchedulerProcess
from tests.waiting import eventually

_UNAVAILABLE = kueue.unavailable()
pytestmark = pytest.mark.skipif(_UNAVAILABLE is not None, reason=_UNAVAILABLE or "")


def _held_gpus(state: State) -> int:
    """GPUs of the pods bound, not finished and not being deleted."""
    return sum(kueue.gpus_of(p) for p in state.values() if kueue.holds(p))


def test_kueue_holds_a_job_a_pytorch_job_and_a_pod_that_name_a_queue(
    queues: Queues, pods: Pods
) -> None:
    """The configured integrations are on and their webhooks are called (dry runs)."""
    queue = queues.make(gpus=4)
    job = pods.devcluster.batch().create_namespaced_job(
        pods.namespace, kueue.job(pods, queue, "held", size=2, gpus=1), dry_run="All"
    )
    assert job.spec.suspend is True
    master = {**kueue.worker(pods, 1), "restartPolicy": "OnFailure"}
    master["containers"] = [{**master["containers"][0], "name": "pytorch"}]
    pytorch = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "held", "labels": {kueue.QUEUE_LABEL: queue}},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {
                    "replicas": 1,
                    "restartPolicy": "OnFailure",
                    "template": {"spec": master},
                }
            }
        },
    }
    made = kueue.custom(pods.devcluster).create_namespaced_custom_object(
        "kubeflow.org", "v1", pods.namespace, "pytorchjobs", pytorch, dry_run="All"
    )
    assert made["spec"]["runPolicy"]["suspend"] is True
    pod = pods.devcluster.core().create_namespaced_pod(
        pods.namespace,
        {
            "metadata": {"name": "held", "labels": {kueue.QUEUE_LABEL: queue}},
            "spec": kueue.worker(pods, 1),
        },
        dry_run="All",
    )
    assert kueue.ADMISSION_GATE in [gate.name for gate in pod.spec.scheduling_gates or []]


def test_every_bind_is_within_the_admitted_quota_and_a_waiting_gang_is_bound_whole_once_it_frees(
    queues: Queues,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    pod_history: History,
    workload_history: History,
) -> None:
    queues.pool.add(2, gpus=8)  # 16 GPUs: room for all three gangs; the quota admits two
    queue = queues.make(gpus=8)
    start_scheduler()
    jobs = {
        name: kueue.submit(pods, queue, name, size=2, gpus=2)
        for name in ("gang-a", "gang-b", "gang-c")
    }
    assert all(job.spec.suspend for job in jobs.values()), "Kueue's webhook holds every Job"

    def admitted_and_bound() -> list[str] | None:
        workloads = kueue.workloads(pods.devcluster, pods.namespace)
        admitted = [
            name
            for name, job in jobs.items()
            if any(kueue.admitted(w) for w in workloads if job.metadata.uid in kueue.owners(w))
        ]
        whole = all(len(kueue.bound_of_job(pods, name)) == 2 for name in admitted)
        return admitted if len(admitted) == 2 and whole else None

    first = eventually(admitted_and_bound, what="two gangs admitted by Kueue and bound by Shoal")
    [waiting] = [name for name in jobs if name not in first]
    uid = jobs[waiting].metadata.uid
    message = eventually(
        lambda: kueue.pending_message(pods.devcluster, pods.namespace, uid),
        what=f"Kueue to say why {waiting} waits",
    )
    assert names.GPU_RESOURCE in message, message
    assert not kueue.job_pods(pods, waiting), "a Job Kueue has not admitted has no pods"

    kueue.deactivate(pods.devcluster, pods.namespace, jobs[first[0]].metadata.uid)
    eventually(
        lambda: len(kueue.bound_of_job(pods, waiting)) == 2,
        what=f"{waiting} admitted and bound whole once {first[0]} gave its quota back",
    )

    pod_history.caught_up()
    workload_history.caught_up()
    quota, _ = queues.gpu_quota()
    held = [_held_gpus(state) for state in pod_history.states()]
    assert max(held) <= quota, f"GPUs held above the ClusterQueue's quota of {quota}: {max(held)}"
    assert max(held) == quota  # two gangs at once fill it: the check above could fail
    admitted_uids = {
        owner
        for state in workload_history.states()
        for workload in state.values()
        if kueue.admitted(workload)
        for owner in kueue.owners(workload)
    }
    job_uids = {name: job.metadata.uid for name, job in jobs.items()}
    for name, pod in kueue.ever_bound(pod_history).items():
        job = (pod.metadata.labels or {}).get(kueue.JOB_NAME_LABEL)
        assert job_uids.get(job or "") in admitted_uids, f"{name} bound for no admitted Workload"
    assert {
        (p.metadata.labels or {}).get(kueue.JOB_NAME_LABEL)
        for p in kueue.ever_bound(pod_history).values()
    } == set(jobs)


def test_a_pod_kueue_gates_is_never_bound_and_is_bound_once_admitted(
    queues: Queues,
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    pod_history: History,
) -> None:
    pool.add(1, gpus=8)
    queue = queues.make(gpus=4)
    scheduler = start_scheduler()
    holder = kueue.submit(pods, queue, "holder", size=2, gpus=2)  # takes the whole quota
    eventually(lambda: len(kueue.bound_of_job(pods, "holder")) == 2, what="the holder bound")

    group = [kueue.group_pod(pods, queue, "group", i, total=2, gpus=2).metadata for i in range(2)]
    for name in (meta.name for meta in group):
        gates = [gate.name for gate in pods.read(name).spec.scheduling_gates or []]
        assert kueue.ADMISSION_GATE in gates, f"Kueue's webhook did not gate {name}: {gates}"
    eventually(
        lambda: kueue.pending_message(pods.devcluster, pods.namespace, group[0].uid),
        what="Kueue to hold the pod group for quota",
    )
    # A pod Kueue does not manage, made after the group, is bound: Shoal has seen the group's
    # pods, with room for them on the node, and left them alone.
    pods.create("unqueued", gpus=1)
    eventually(lambda: pods.node_of("unqueued"), what="the unqueued pod bound")
    members = [meta.name for meta in group]
    assert not pods.bound(members)

    kueue.deactivate(pods.devcluster, pods.namespace, holder.metadata.uid)
    eventually(
        lambda: len(pods.bound(members)) == 2, what="the pod group admitted, ungated and bound"
    )
    pod_history.caught_up()
    for name in members:
        for version in pod_history.versions(name):
            gated = [gate.name for gate in version.spec.scheduling_gates or []]
            assert not (version.spec.node_name and gated), f"{name} bound while gated: {gated}"
    failed = [
        line
        for line in scheduler.log_lines()
        if line.get("event") == "bind_failed" and str(line.get("pod", "")).split("/")[-1] in members
    ]
    assert not failed, failed


def test_a_kueue_pod_group_is_one_gang_bound_whole_after_admission(
    queues: Queues,
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    pod_history: History,
) -> None:
    """Admitted, the group's two pods are ungated together; with room for only one of them,
    Shoal binds neither (one gang, all or nothing) and says so, then both once there is room."""
    pool.add(1, gpus=8)
    queue = queues.make(gpus=8)
    start_scheduler()
    pods.create("filler", gpus=4)  # not Kueue's: leaves room for one 3-GPU member, not two
    eventually(lambda: pods.node_of("filler"), what="the filler bound")
    members = [
        kueue.group_pod(pods, queue, "pair", i, total=2, gpus=3).metadata.name for i in range(2)
    ]

    def ungated() -> bool:
        return all(
            kueue.ADMISSION_GATE not in [g.name for g in pods.read(n).spec.scheduling_gates or []]
            for n in members
        )

    eventually(ungated, what="Kueue to admit the pod group and ungate its pods")
    eventually(
        lambda: [e for n in members for e in pods.events(n) if e.reason == "FailedScheduling"],
        what="a FailedScheduling Event on the gang: one member fits, the gang does not",
    )
    assert not pods.bound(members), "a member was bound without the rest of its gang"
    pool.add(1, gpus=8, prefix="more")
    eventually(lambda: len(pods.bound(members)) == 2, what="the pod group bound whole")
    pod_history.caught_up()
    for name in members:
        for version in pod_history.versions(name):
            gated = [g.name for g in version.spec.scheduling_gates or []]
            assert not (version.spec.node_name and gated), f"{name} bound while gated"
