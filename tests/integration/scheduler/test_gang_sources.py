"""Gangs defined by other schedulers' objects (Volcano's PodGroup) on a real API server, and
pods whose gang cannot be told: admitted whole or not at all, or waiting with a reason."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from contracts import names
from tests.integration.conftest import Devcluster
from tests.integration.scheduler.conftest import (
    KWOK_TOLERATION,
    TEST_LABEL,
    Pods,
    Pool,
    SchedulerProcess,
    ensure_priority_class,
)
from tests.waiting import eventually

EXAMPLES = Path(__file__).resolve().parents[3] / "manifests" / "examples"
VOLCANO = ("scheduling.volcano.sh", "v1beta1")


def _volcano_group(pods: Pods, name: str, spec: dict[str, Any], **notes: str) -> dict[str, Any]:
    body = {
        "apiVersion": "/".join(VOLCANO),
        "kind": "PodGroup",
        "metadata": {"name": name, "annotations": notes},
        "spec": spec,
    }
    custom = client.CustomObjectsApi(pods.devcluster.api)
    created: dict[str, Any] = custom.create_namespaced_custom_object(
        *VOLCANO, pods.namespace, "podgroups", body
    )
    return created


def _volcano_phase(pods: Pods, name: str) -> str | None:
    custom = client.CustomObjectsApi(pods.devcluster.api)
    group = custom.get_namespaced_custom_object(*VOLCANO, pods.namespace, "podgroups", name)
    phase = (group.get("status") or {}).get("phase")
    return str(phase) if phase else None


def _waiting_reason(pods: Pods, name: str) -> tuple[str, str] | None:
    condition = pods.condition(name)
    if condition is None or condition.status != "False":
        return None
    return condition.reason, condition.message


def _job_pods(pods: Pods, job: str) -> list[str]:
    return [p.metadata.name for p in pods.all() if (p.metadata.labels or {}).get("job-name") == job]


def _example_job(pods: Pods, pool: Pool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Volcano example's PodGroup and Job, in the test's namespace, scheduler and pool."""
    group, job = yaml.safe_load_all((EXAMPLES / "volcano-podgroup.yaml").read_text())
    for doc in (group, job):
        doc["metadata"]["namespace"] = pods.namespace
    spec = job["spec"]["template"]["spec"]
    spec["schedulerName"] = pods.scheduler
    spec["nodeSelector"] = {TEST_LABEL: pool.pool}
    spec["tolerations"] = [KWOK_TOLERATION]
    return group, job


@pytest.mark.usefixtures("volcano_crd")
def test_volcano_example_job_is_admitted_whole_or_not_at_all(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    pool.add(1, gpus=8)  # room for one 8-GPU member of a gang whose minimum is two
    group, job = _example_job(pods, pool)
    custom = client.CustomObjectsApi(pods.devcluster.api)
    custom.create_namespaced_custom_object(*VOLCANO, pods.namespace, "podgroups", group)
    client.BatchV1Api(pods.devcluster.api).create_namespaced_job(pods.namespace, job)
    name = group["metadata"]["name"]
    eventually(lambda: len(_job_pods(pods, name)) == 4, what="the Job's four pods")
    members = _job_pods(pods, name)
    start_scheduler()

    reason = eventually(lambda: _waiting_reason(pods, members[0]), what="a waiting reason")
    assert reason[0] == "Unschedulable"
    assert pods.bound(members) == {}  # not one member of a gang that cannot start whole
    assert _volcano_phase(pods, name) == "Pending"

    def queue_event() -> list[Any]:
        return [e for e in pods.events(name) if e.reason == "FieldIgnored"]

    [event] = eventually(queue_event, what="an Event saying spec.queue is ignored")
    assert event.involved_object.kind == "PodGroup"
    assert event.type == "Normal"
    assert "spec.queue 'default' is ignored" in event.message

    pool.add(1, gpus=8, prefix="second")
    eventually(lambda: len(pods.bound(members)) == 2, what="the minimum, both at once")
    eventually(lambda: _volcano_phase(pods, name) == "Running", what="phase Running")
    pool.add(2, gpus=8, prefix="more")
    eventually(lambda: len(pods.bound(members)) == 4, what="the gang grown to its maximum")


@pytest.mark.usefixtures("volcano_crd")
def test_volcano_priority_class_orders_gangs_and_min_task_member_is_waited_for(
    devcluster: Devcluster,
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
) -> None:
    ensure_priority_class(devcluster, "shoal-test-high", 100000)
    pool.add(1, gpus=8)
    _volcano_group(pods, "low", {"minMember": 1})
    low = pods.create("low-0", gpus=8, annotations={names.VOLCANO_GROUP_ANNOTATION: "low"})
    created = pods.read(low).metadata.creation_timestamp.timestamp()
    eventually(lambda: time.time() >= created + 1, timeout=5, interval=0.05, what="a new second")
    # Younger, and its pods carry no priority: the PodGroup's class alone puts it first.
    _volcano_group(pods, "high", {"minMember": 1, "priorityClassName": "shoal-test-high"})
    high = pods.create("high-0", gpus=8, annotations={names.VOLCANO_GROUP_ANNOTATION: "high"})

    tasks = {names.VOLCANO_GROUP_ANNOTATION: "tasks"}
    _volcano_group(pods, "tasks", {"minMember": 1, "minTaskMember": {"ps": 1, "worker": 2}})
    worker0 = pods.create(
        "tasks-worker-0", gpus=0, annotations={**tasks, names.VOLCANO_TASK_ANNOTATION: "worker"}
    )
    start_scheduler()

    eventually(lambda: pods.node_of(high), what="the high-priority gang")
    assert pods.node_of(low) is None
    reason = eventually(lambda: _waiting_reason(pods, worker0), what="the task gang's reason")
    assert reason[0] == "InvalidGang"
    assert "task ps has 0 of 1" in reason[1]
    assert "task worker has 1 of 2" in reason[1]

    rest = [
        pods.create(
            "tasks-ps-0", gpus=0, annotations={**tasks, names.VOLCANO_TASK_ANNOTATION: "ps"}
        ),
        pods.create(
            "tasks-worker-1", gpus=0, annotations={**tasks, names.VOLCANO_TASK_ANNOTATION: "worker"}
        ),
    ]
    eventually(lambda: len(pods.bound([worker0, *rest])) == 3, what="every task's members")


@pytest.mark.usefixtures("volcano_crd", "pod_group_crd")
def test_pod_naming_two_gangs_or_a_missing_group_waits_and_says_why(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    pool.add(1, gpus=8)
    both = pods.create(
        "both",
        labels={names.POD_GROUP_LABEL: "train"},
        annotations={names.VOLCANO_GROUP_ANNOTATION: "train"},
    )
    ghost = pods.create("ghost", annotations={names.VOLCANO_GROUP_ANNOTATION: "ghost"})
    plain = pods.create("plain")
    start_scheduler()
    eventually(lambda: pods.node_of(plain), what="the plain pod")

    reason = eventually(lambda: _waiting_reason(pods, both), what="the two-gang pod's reason")
    assert reason[0] == "InvalidGang"
    assert "names more than one gang" in reason[1]
    assert f"label {names.POD_GROUP_LABEL}" in reason[1]
    assert f"annotation {names.VOLCANO_GROUP_ANNOTATION}" in reason[1]
    eventually(
        lambda: any(e.reason == "InvalidGang" for e in pods.events(both)),
        what="an InvalidGang Event on the pod",
    )

    reason = eventually(lambda: _waiting_reason(pods, ghost), what="the missing group's reason")
    assert reason[0] == "InvalidGang"
    assert "Volcano PodGroup" in reason[1]
    assert "does not exist" in reason[1]
    assert pods.bound([both, ghost]) == {}

    _volcano_group(pods, "ghost", {"minMember": 1})
    eventually(lambda: pods.node_of(ghost), what="the pod once its PodGroup exists")
    assert pods.node_of(both) is None


K8S = ("scheduling.k8s.io", "v1beta1")


def _k8s_condition(pods: Pods, name: str) -> dict[str, Any] | None:
    custom = client.CustomObjectsApi(pods.devcluster.api)
    group = custom.get_namespaced_custom_object(*K8S, pods.namespace, "podgroups", name)
    for condition in (group.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodGroupInitiallyScheduled":
            return dict(condition)
    return None


def _set_min_count(pods: Pods, name: str, count: int) -> None:
    custom = client.CustomObjectsApi(pods.devcluster.api)
    body = {"spec": {"schedulingPolicy": {"gang": {"minCount": count}}}}
    custom.patch_namespaced_custom_object(*K8S, pods.namespace, "podgroups", name, body)


def test_kubernetes_pod_group_is_all_or_nothing_and_follows_min_count(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    pool.add(1, gpus=8)  # room for one 8-GPU member of a gang whose minimum is two
    group, job = yaml.safe_load_all((EXAMPLES / "kubernetes-podgroup.yaml").read_text())
    for doc in (group, job):
        doc["metadata"]["namespace"] = pods.namespace
    spec = job["spec"]["template"]["spec"]
    spec.update(
        schedulerName=pods.scheduler,
        nodeSelector={TEST_LABEL: pool.pool},
        tolerations=[KWOK_TOLERATION],
    )
    custom = client.CustomObjectsApi(pods.devcluster.api)
    custom.create_namespaced_custom_object(*K8S, pods.namespace, "podgroups", group)
    client.BatchV1Api(pods.devcluster.api).create_namespaced_job(pods.namespace, job)
    name = group["metadata"]["name"]
    eventually(lambda: len(_job_pods(pods, name)) == 4, what="the Job's four pods")
    members = _job_pods(pods, name)
    start_scheduler()

    reason = eventually(lambda: _waiting_reason(pods, members[0]), what="a waiting reason")
    assert reason[0] == "Unschedulable"
    assert pods.bound(members) == {}
    waiting = eventually(lambda: _k8s_condition(pods, name), what="the PodGroup's condition")
    assert (waiting["status"], waiting["reason"]) == ("False", "Unschedulable")

    # minCount is mutable: raised to 4, three nodes are not enough for any member.
    _set_min_count(pods, name, 4)
    eventually(
        lambda: "minCount 4" in ((_k8s_condition(pods, name) or {}).get("message") or ""),
        what="the condition to follow minCount 4",
    )
    pool.add(2, gpus=8, prefix="more")
    witness = pods.create("witness", gpus=8)  # binds once the scheduler has seen three nodes
    eventually(lambda: pods.node_of(witness), what="a plain pod on a node the gang cannot use")
    assert pods.bound(members) == {}
    pods.delete([witness])

    _set_min_count(pods, name, 3)
    eventually(lambda: len(pods.bound(members)) == 3, what="three members once minCount is 3")
    placed = eventually(
        lambda: (c := _k8s_condition(pods, name)) is not None and c["status"] == "True" and c,
        what="PodGroupInitiallyScheduled=True",
    )
    assert placed["reason"] == "Scheduled"


def test_plain_indexed_job_is_scheduled_through_the_pod_group_its_controller_made(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    """With WorkloadWithJob the Job controller makes a PodGroup (basic policy) for an Indexed
    Job and names it in each pod's spec.schedulingGroup: no Shoal label, and Shoal schedules the
    pods as that group and reports on it as kube-scheduler would."""
    pool.add(1, gpus=8)
    template = {
        "spec": {
            "schedulerName": pods.scheduler,
            "restartPolicy": "Never",
            "nodeSelector": {TEST_LABEL: pool.pool},
            "tolerations": [KWOK_TOLERATION],
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.example/trainer:1",
                    "resources": {"limits": {names.GPU_RESOURCE: "4"}},
                }
            ],
        }
    }
    job = {
        "metadata": {"name": "plain"},
        "spec": {
            "completionMode": "Indexed",
            "completions": 2,
            "parallelism": 2,
            "template": template,
        },
    }
    client.BatchV1Api(pods.devcluster.api).create_namespaced_job(pods.namespace, job)
    eventually(lambda: len(_job_pods(pods, "plain")) == 2, what="the Job's two pods")
    members = _job_pods(pods, "plain")
    group = pods.read(members[0]).spec.scheduling_group.pod_group_name
    assert group, "the Job controller names a PodGroup in the pods' spec.schedulingGroup"
    start_scheduler()

    eventually(lambda: len(pods.bound(members)) == 2, what="the Job's pods")
    placed = eventually(
        lambda: (c := _k8s_condition(pods, group)) is not None and c["status"] == "True" and c,
        what="PodGroupInitiallyScheduled=True on the Job's PodGroup",
    )
    assert placed["reason"] == "Scheduled"


def _k8s_conditions(pods: Pods, name: str) -> dict[str, dict[str, Any]]:
    custom = client.CustomObjectsApi(pods.devcluster.api)
    group = custom.get_namespaced_custom_object(*K8S, pods.namespace, "podgroups", name)
    return {str(c["type"]): dict(c) for c in (group.get("status") or {}).get("conditions") or []}


def _k8s_member(pods: Pods, name: str, group: str) -> str:
    return pods.create(name, gpus=8, pod_group=group)


def test_kubernetes_pod_group_reclaimed_for_a_higher_priority_gang_is_a_disruption_target(
    devcluster: Devcluster,
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
) -> None:
    """The condition the PodGroup API defines for preemption, as kube-scheduler words it,
    beside the PodGroupInitiallyScheduled=True that stays."""
    ensure_priority_class(devcluster, "shoal-test-high", 100000)
    pool.add(2, gpus=8)
    body = {
        "apiVersion": "/".join(K8S),
        "kind": "PodGroup",
        "metadata": {"name": "low"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}},
    }
    custom = client.CustomObjectsApi(pods.devcluster.api)
    custom.create_namespaced_custom_object(*K8S, pods.namespace, "podgroups", body)
    low = [_k8s_member(pods, f"low-{i}", "low") for i in range(2)]
    start_scheduler("--reclaim-grace", "3")
    eventually(lambda: len(pods.bound(low)) == 2, what="the low-priority PodGroup gang")
    eventually(
        lambda: (
            _k8s_conditions(pods, "low").get("PodGroupInitiallyScheduled", {}).get("status")
            == "True"
        ),
        what="PodGroupInitiallyScheduled=True",
    )
    assert "DisruptionTarget" not in _k8s_conditions(pods, "low")

    urgent = pods.gang("urgent", 2, gpus=8, min_member=2, priority_class="shoal-test-high")
    disrupted = eventually(
        lambda: _k8s_conditions(pods, "low").get("DisruptionTarget"),
        what="DisruptionTarget on the reclaimed PodGroup",
    )
    assert disrupted["status"] == "True"
    assert disrupted["reason"] == "PreemptionByScheduler"
    assert disrupted["message"] == (
        f"{pods.scheduler}: preempting to accommodate a higher priority podgroup"
    )
    assert disrupted["lastTransitionTime"]
    eventually(lambda: len(pods.bound(urgent)) == 2, what="the high-priority gang in its room")
    conditions = _k8s_conditions(pods, "low")
    assert conditions["PodGroupInitiallyScheduled"]["status"] == "True"  # for good
    assert conditions["DisruptionTarget"] == disrupted  # written once
