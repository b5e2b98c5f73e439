"""A training job changes its gang's bounds and its pods' CPU while it runs (a stage change),
on the devcluster: Shoal grows in a second, shrinks through the notice path, waits for room for
a raised minimum without evicting, and never over-commits a node while a resize is in flight.

kwok nodes run no kubelet, so nothing applies an in-place resize: the test plays the kubelet's
part by writing the pod's ``status.containerStatuses[].allocatedResources`` and ``resources``
through the status subresource, as the kubelet does once it has allocated a resize.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
from kubernetes import client

from contracts import names
from tests import figures
from tests.integration.history import History
from tests.integration.scheduler.conftest import Pods, Pool, SchedulerProcess
from tests.waiting import eventually

SECTION = "stage changes"
VOLCANO = ("scheduling.volcano.sh", "v1beta1")


@pytest.fixture
def history(pods: Pods) -> Iterator[History]:
    record = History(pods.devcluster.core().list_namespaced_pod, pods.namespace)
    yield record
    record.close()


def _annotate(pods: Pods, names_: list[str], **notes: str) -> None:
    core = pods.devcluster.core()
    for name in names_:
        core.patch_namespaced_pod(name, pods.namespace, {"metadata": {"annotations": notes}})


def _bound_at(history: History, name: str) -> float:
    at = history.when(name, lambda p: bool(p.spec.node_name))
    assert at is not None, f"{name} never bound"
    return at


def _reasons(pods: Pods, name: str, reason: str) -> list[Any]:
    return [e for e in pods.events(name) if e.reason == reason]


def test_raising_a_label_gangs_maximum_binds_the_new_members_within_a_second(
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    history: History,
) -> None:
    pool.add(1, gpus=8)
    start_scheduler()
    members = pods.gang("grow", 4, gpus=2, min_member=1, max_member=2)
    eventually(lambda: len(pods.bound(members)) == 2, what="the gang at its maximum of 2")
    raised = time.monotonic()
    _annotate(pods, members, **{names.MAX_MEMBER_ANNOTATION: "4"})
    eventually(lambda: len(pods.bound(members)) == 4, timeout=30, what="4 members bound")
    took = max(_bound_at(history, n) for n in members) - raised
    figures.record(SECTION, "label gang: max raised to new members bound (s)", round(took, 2))
    assert took < 1.0, f"the new members bound {took:.2f} s after the maximum was raised"


def test_raising_a_volcano_pod_groups_maximum_binds_the_new_members_within_a_second(
    volcano_crd: None,
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    history: History,
) -> None:
    pool.add(1, gpus=8)
    start_scheduler()
    custom = client.CustomObjectsApi(pods.devcluster.api)
    body = {
        "apiVersion": "/".join(VOLCANO),
        "kind": "PodGroup",
        "metadata": {"name": "vgrow", "annotations": {names.MAX_MEMBER_ANNOTATION: "2"}},
        "spec": {"minMember": 1},
    }
    custom.create_namespaced_custom_object(*VOLCANO, pods.namespace, "podgroups", body)
    members = [
        pods.create(f"vgrow-{i}", gpus=2, annotations={"scheduling.k8s.io/group-name": "vgrow"})
        for i in range(4)
    ]
    eventually(lambda: len(pods.bound(members)) == 2, what="the PodGroup at its maximum of 2")
    raised = time.monotonic()
    patch = {"metadata": {"annotations": {names.MAX_MEMBER_ANNOTATION: "4"}}}
    custom.patch_namespaced_custom_object(*VOLCANO, pods.namespace, "podgroups", "vgrow", patch)
    eventually(lambda: len(pods.bound(members)) == 4, timeout=30, what="4 members bound")
    took = max(_bound_at(history, n) for n in members) - raised
    figures.record(SECTION, "Volcano PodGroup: max raised to new members bound (s)", round(took, 2))
    assert took < 1.0, f"the new members bound {took:.2f} s after the maximum was raised"


def test_lowering_the_maximum_asks_the_youngest_surplus_to_leave_and_leaves_the_rest(
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    history: History,
) -> None:
    pool.add(1, gpus=8)
    grace = 3
    start_scheduler("--reclaim-grace", str(grace))
    members = pods.gang("shrink", 4, gpus=2, min_member=1, max_member=4)
    eventually(lambda: len(pods.bound(members)) == 4, what="the gang at its maximum of 4")
    nodes_before = pods.bound(members)
    lowered = time.monotonic()
    _annotate(pods, members, **{names.MAX_MEMBER_ANNOTATION: "2"})
    surplus, rest = members[2:], members[:2]  # the youngest two leave
    for name in surplus:

        def told(name: str = name) -> list[Any]:
            return _reasons(pods, name, "Reclaimed")

        said = eventually(told, timeout=30, what=f"{name} told")
        assert "maximum is now 2" in said[-1].message, said[-1].message
    core = pods.devcluster.core()
    eventually(
        lambda: not any(p.metadata.name in surplus for p in pods.all()),
        timeout=60,
        what="the surplus members gone",
    )
    gone = time.monotonic()
    history.caught_up()
    for name in surplus:
        notes = [v.metadata.annotations or {} for v in history.versions(name)]
        assert any(names.LEAVE_BY_ANNOTATION in n for n in notes), "evicted without a notice"
    for name in rest:
        for version in history.versions(name):
            assert names.LEAVE_BY_ANNOTATION not in (version.metadata.annotations or {})
            assert version.metadata.deletion_timestamp is None
        assert core.read_namespaced_pod(name, pods.namespace).spec.node_name == nodes_before[name]
    figures.record(
        SECTION,
        f"max lowered to surplus gone, no acknowledgement (s, grace {grace} s)",
        round(gone - lowered, 2),
    )


def _stamp(line: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(line["timestamp"]).replace("Z", "+00:00")).timestamp()


def test_raising_the_minimum_without_room_keeps_the_gang_running_until_room_appears(
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    history: History,
) -> None:
    pool.add(2, gpus=8)
    torn_grace = 2
    scheduler = start_scheduler("--torn-grace", str(torn_grace), "--reclaim-grace", "2")
    members = pods.gang("stage", 4, gpus=4, min_member=2, max_member=2)
    eventually(lambda: len(pods.bound(members)) == 2, what="the gang's first stage bound")
    blocker = pods.gang("blocker", 2, gpus=4, min_member=2, max_member=2)
    eventually(lambda: len(pods.bound(blocker)) == 2, what="the blocker bound")
    running = sorted(pods.bound(members))
    waiting = [n for n in members if n not in running]
    raised_at = time.time()
    _annotate(
        pods,
        members,
        **{names.MIN_MEMBER_ANNOTATION: "4", names.MAX_MEMBER_ANNOTATION: "4"},
    )

    def says_what_it_waits_for() -> list[Any]:
        return [
            e
            for n in waiting
            for e in pods.events(n)
            if e.reason == "WaitingForRoom" and "below its raised minimum 4" in (e.message or "")
        ]

    told = eventually(says_what_it_waits_for, timeout=30, what="an Event naming what it waits for")
    assert "waits for room for 2 more" in told[-1].message, told[-1].message

    def decided_past_the_grace() -> bool:
        # The scheduler's own record that it decided for the gang after the torn grace and the
        # reclaim grace had both passed: a release would have been written by then.
        return any(
            line.get("event") == "cycle"
            and line.get("gang") == f"{pods.namespace}/stage"
            and _stamp(line) > raised_at + torn_grace + 2 + 1
            for line in scheduler.log_lines()
        )

    eventually(decided_past_the_grace, timeout=60, what="a decision past both graces")
    for name in running:
        assert not _reasons(pods, name, "GangBelowMinimum")
        assert not _reasons(pods, name, "GangReleased")
    pods.delete(blocker)  # room appears
    eventually(lambda: len(pods.bound(members)) == 4, timeout=30, what="the raised minimum bound")
    history.caught_up()
    for name in running:
        for version in history.versions(name):
            assert names.LEAVE_BY_ANNOTATION not in (version.metadata.annotations or {})
            assert version.metadata.deletion_timestamp is None


def _cpu_milli(text: str | None) -> int:
    if not text:
        return 0
    return int(float(text[:-1])) if text.endswith("m") else int(float(text) * 1000)


def _counted_cpu(pod: Any) -> int:
    """A pod's CPU as kube-scheduler counts it: the largest of spec, allocated and actual."""
    statuses = {s.name: s for s in (pod.status.container_statuses or [])}
    total = 0
    for container in pod.spec.containers:
        spec = (container.resources.requests or {}).get("cpu")
        status = statuses.get(container.name)
        allocated = (status.allocated_resources or {}).get("cpu") if status else None
        actual = None
        if status is not None and status.resources is not None:
            actual = (status.resources.requests or {}).get("cpu")
        total += max(_cpu_milli(spec), _cpu_milli(allocated), _cpu_milli(actual))
    return total


def _kubelet_allocates(pods: Pods, name: str, cpu: str) -> None:
    """The kubelet's part: the resize allocated and applied at ``cpu``."""
    core = pods.devcluster.core()
    pod = core.read_namespaced_pod(name, pods.namespace)
    statuses = [
        {
            "name": c.name,
            "image": c.image,
            "imageID": "",
            "ready": True,
            "restartCount": 0,
            "state": {"running": {}},
            "allocatedResources": {"cpu": cpu, names.GPU_RESOURCE: "1"},
            "resources": {
                "requests": {"cpu": cpu, names.GPU_RESOURCE: "1"},
                "limits": {"cpu": cpu, names.GPU_RESOURCE: "1"},
            },
        }
        for c in pod.spec.containers
    ]
    core.patch_namespaced_pod_status(
        name, pods.namespace, {"status": {"containerStatuses": statuses}}
    )


def test_a_resize_in_flight_never_over_commits_its_node(
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    history: History,
) -> None:
    (node,) = pool.add(1, gpus=8, cpu="96")
    start_scheduler()
    big = pods.create("stage-cpu", gpus=1, cpu="90")
    eventually(lambda: pods.node_of(big), what="the CPU-heavy stage bound")
    _kubelet_allocates(pods, big, "90")
    eventually(
        lambda: _counted_cpu(pods.read(big)) == 90_000 or None, what="the kubelet's allocation"
    )
    # The job's next stage needs 10 CPUs: the resize is requested, not applied yet.
    resize = {
        "spec": {
            "containers": [
                {
                    "name": "worker",
                    "resources": {"requests": {"cpu": "10"}, "limits": {"cpu": "10"}},
                }
            ]
        }
    }
    pods.devcluster.core().patch_namespaced_pod_resize(big, pods.namespace, resize)
    other = pods.create("other", gpus=1, cpu="50")
    eventually(
        lambda: [e for e in pods.events(other) if e.reason == "FailedScheduling"],
        timeout=30,
        what="the new pod waiting while the downsize is not applied",
    )
    assert pods.node_of(other) is None
    _kubelet_allocates(pods, big, "10")  # applied: the room is free now
    eventually(lambda: pods.node_of(other), timeout=30, what="the new pod bound after the resize")
    history.caught_up()
    for state in history.states():
        used = sum(_counted_cpu(p) for p in state.values() if p.spec.node_name == node)
        assert used <= 96_000, f"node {node} counted for {used}m of 96000m CPU"
