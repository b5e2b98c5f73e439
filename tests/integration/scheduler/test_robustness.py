"""Restarts, bad input and PodGroups on a real API server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from contracts import names
from tests.integration.conftest import Devcluster
from tests.integration.scheduler.conftest import ROOT, Pods, Pool, SchedulerProcess
from tests.waiting import eventually


def _gpus(pod: Any) -> int:
    limits = pod.spec.containers[0].resources.limits or {}
    return int(limits.get(names.GPU_RESOURCE, 0))


@pytest.mark.reliability
def test_killed_and_restarted_scheduler_double_books_nothing_and_leaves_no_partial_gang(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    nodes = pool.add(3, gpus=8)
    gangs = {f"g{i}": pods.gang(f"g{i}", 2, gpus=4) for i in range(5)}  # room for three
    every = [p for members in gangs.values() for p in members]
    first = start_scheduler()
    eventually(lambda: len(pods.bound(every)) >= 1, what="the first bindings")
    first.kill()
    start_scheduler()
    eventually(lambda: len(pods.bound(every)) == 6, what="three whole gangs bound")

    def settled() -> bool:
        # Every gang either whole or empty, checked on one listing.
        bound = pods.bound(every)
        return all(len([p for p in m if p in bound]) in (0, 2) for m in gangs.values())

    eventually(settled, what="no gang partially bound")
    bound = pods.bound(every)
    per_node: dict[str, int] = defaultdict(int)
    for pod in pods.all():
        if pod.metadata.name in bound:
            per_node[pod.spec.node_name] += _gpus(pod)
    assert set(per_node) <= set(nodes)
    assert all(used <= 8 for used in per_node.values()), per_node
    assert sum(per_node.values()) == 24


def _condition_message(pods: Pods, name: str) -> str | None:
    condition = pods.condition(name)
    return condition.message if condition is not None else None


def test_bad_gang_annotations_are_reported_and_the_rest_is_scheduled(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    pool.add(1, gpus=8)
    wrong_min = pods.gang("wrong-min", 1, min_member="two")
    inverted = pods.gang("inverted", 1, min_member=3, max_member=2)
    mixed = pods.gang("mixed", 1)
    pods.create("mixed-other", labels={names.GANG_LABEL: "mixed"}, scheduler="default-scheduler")
    good = pods.gang("good", 2, gpus=2)
    start_scheduler()

    eventually(lambda: len(pods.bound(good)) == 2, what="the valid gang")
    message = eventually(lambda: _condition_message(pods, wrong_min[0]), what="a condition")
    assert "shoal.dev/min-member: must be a whole number >= 1, got 'two'" in message
    assert pods.condition(wrong_min[0]).reason == "InvalidGang"
    message = eventually(lambda: _condition_message(pods, inverted[0]), what="a condition")
    assert "(2) is smaller than the minimum (3)" in message
    message = eventually(lambda: _condition_message(pods, mixed[0]), what="a condition")
    assert "different schedulerNames" in message
    warnings = eventually(
        lambda: [e for e in pods.events(wrong_min[0]) if e.type == "Warning"],
        what="a Warning Event",
    )
    assert warnings[0].reason == "InvalidGang"
    assert pods.bound([*wrong_min, *inverted, *mixed]) == {}


@pytest.mark.usefixtures("pod_group_crd")
def test_pod_group_gang_waits_for_its_group_then_reports_status(
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
) -> None:
    pool.add(2, gpus=8)
    custom = client.CustomObjectsApi(pods.devcluster.api)
    namespace = pods.namespace
    members = [
        pods.create(f"pg-{i}", gpus=8, labels={names.POD_GROUP_LABEL: "train"}) for i in range(3)
    ]
    start_scheduler()
    message = eventually(lambda: _condition_message(pods, members[0]), what="a condition")
    assert "PodGroup" in message
    assert "does not exist yet" in message
    assert pods.condition(members[0]).reason == "PodGroupNotFound"
    assert pods.condition(members[0]).status == "False"
    told = eventually(
        lambda: [e for e in pods.events(members[0]) if e.reason == "PodGroupNotFound"],
        what="a PodGroupNotFound Event",
    )
    assert told[0].type == "Warning"
    assert f"PodGroup {namespace}/train" in told[0].message
    assert pods.bound(members) == {}  # no member runs alone meanwhile

    custom.create_namespaced_custom_object(
        "scheduling.x-k8s.io",
        "v1alpha1",
        namespace,
        "podgroups",
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": "train", "annotations": {names.MAX_MEMBER_ANNOTATION: "3"}},
            "spec": {"minMember": 2},
        },
    )
    eventually(lambda: len(pods.bound(members)) == 2, what="the PodGroup's minimum")

    def status() -> dict[str, Any] | None:
        group = custom.get_namespaced_custom_object(
            "scheduling.x-k8s.io", "v1alpha1", namespace, "podgroups", "train"
        )
        found = group.get("status") or {}
        return found if found.get("phase") == "Running" else None

    found = eventually(status, what="PodGroup status Running")
    assert (found["running"], found["succeeded"], found["failed"]) == (2, 0, 0)


@pytest.mark.usefixtures("pod_group_crd")
def test_pod_group_with_a_bad_size_gets_a_warning_event(
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
) -> None:
    pool.add(1, gpus=8)
    custom = client.CustomObjectsApi(pods.devcluster.api)
    namespace = pods.namespace
    created = custom.create_namespaced_custom_object(
        "scheduling.x-k8s.io",
        "v1alpha1",
        namespace,
        "podgroups",
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            # The published schema refuses a minMember below 1; a maximum below it is Shoal's
            # to refuse.
            "metadata": {"name": "zero", "annotations": {names.MAX_MEMBER_ANNOTATION: "1"}},
            "spec": {"minMember": 2},
        },
    )
    member = pods.create("zero-0", labels={names.POD_GROUP_LABEL: "zero"})
    plain = pods.create("plain")
    start_scheduler()
    eventually(lambda: pods.node_of(plain), what="the plain pod")

    def group_warning() -> list[Any]:
        return [e for e in pods.events("zero") if e.type == "Warning"]

    warnings = eventually(group_warning, what="a Warning Event on the PodGroup")
    assert warnings[0].involved_object.kind == "PodGroup"
    # kubectl describe podgroup selects Events by the object's uid too.
    assert warnings[0].involved_object.uid == created["metadata"]["uid"]
    assert "max-member (1) is smaller than the minimum (2)" in warnings[0].message
    assert pods.node_of(member) is None


def test_health_ready_and_metrics_endpoints(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    pool.add(1, gpus=8)
    scheduler = start_scheduler()
    assert scheduler.get("/healthz") == (200, "ok\n")
    assert scheduler.get("/readyz") == (200, "ok\n")
    name = pods.create("measured")
    eventually(lambda: pods.node_of(name), what="a binding")
    status, text = scheduler.get("/metrics")
    assert status == 200
    assert 'shoal_scheduler_binds_total{result="ok"} 1.0' in text
    assert "shoal_scheduler_gang_decision_seconds_count" in text
    cycles = [line for line in scheduler.log_lines() if line.get("event") == "cycle"]
    assert any(c["gang"].endswith("pod:measured") and c["placed_min"] == 1 for c in cycles)


def test_two_replicas_one_leads_and_the_standby_takes_over_when_it_dies(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    pool.add(1, gpus=8)
    flags = ("--leader-elect", "true", "--lease-namespace", pods.namespace)
    first = start_scheduler(*flags)
    eventually(lambda: first.get("/readyz") == (200, "leader\n"), what="a leader")
    second = start_scheduler(*flags)
    assert second.get("/readyz") == (200, "standby\n")
    one = pods.create("one")
    eventually(lambda: pods.node_of(one), what="the leader to bind a pod")
    assert not [line for line in second.log_lines() if line.get("event") == "cycle"]

    first.kill()
    eventually(
        lambda: second.get("/readyz") == (200, "leader\n"),
        timeout=120,
        what="the standby to take the Lease",
    )
    two = pods.create("two")
    eventually(lambda: pods.node_of(two), what="the new leader to bind a pod")


def test_the_scheduler_as_pid_1_stops_on_a_sigterm_that_came_while_it_started(
    devcluster: Devcluster, scheduler_name: str, tmp_path: Path
) -> None:
    """A pod deleted right after its container (re)started: the scheduler, PID 1 in its own PID
    namespace as in a container, gets SIGTERM while it still imports and starts. It must not
    ignore it (a process that does runs on until the kubelet kills it, exit 137): it stops in
    order as soon as it is up, and exits 0."""
    log = tmp_path / "pid1.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-m", "scheduler",
             "--kubeconfig", devcluster.kubeconfig, "--scheduler-name", scheduler_name,
             "--http-host", "127.0.0.1", "--http-port", "0", "--log-format", "json"],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
    try:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        child = int(eventually(lambda: children.read_text().split(), interval=0.005, what="it")[0])
        # The moment it can hear SIGTERM at all (no program hears one before its interpreter
        # runs its first line), while its imports still take a second or more.
        eventually(lambda: _catches(child, signal.SIGTERM), interval=0.005, what="a handler")
        os.kill(child, signal.SIGTERM)
        try:
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the scheduler ignored a SIGTERM that came while it started; see {log}")
    finally:
        proc.kill()
        proc.wait()
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert code == 0, log.read_text()[-2000:]
    events = [line["event"] for line in lines]
    assert "stop_heard_while_starting" in events, events
    assert events[-1] == "stopped"


def _catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (its SigCgt mask)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False
