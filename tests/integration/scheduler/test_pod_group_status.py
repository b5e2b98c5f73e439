"""scheduler-plugins PodGroups on a real API server with the published CRD: the status Shoal
writes (as that project's own controller keeps it), and what waiting members are told.

kwok stands in for the kubelet: it makes bound pods Running; a test makes a pod finish by
writing its phase through the status subresource, as a kubelet would."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog
import structlog.testing
from kubernetes import client

from contracts import names
from contracts.times import parse_time
from scheduler.k8s.client import Rest
from tests import figures
from tests.integration.history import History
from tests.integration.scheduler.conftest import Pods, Pool, SchedulerProcess
from tests.waiting import eventually

pytestmark = pytest.mark.usefixtures("pod_group_crd")
SECTION = "PodGroup status"
GROUP, VERSION, PLURAL = "scheduling.x-k8s.io", "v1alpha1", "podgroups"
#: Every status field of the published schema.
STATUS_FIELDS = {"phase", "occupiedBy", "running", "succeeded", "failed", "scheduleStartTime"}
ORDER = ["Pending", "Scheduling", "Running", "Failed", "Finished"]


class Groups:
    """The test's PodGroups."""

    def __init__(self, pods: Pods) -> None:
        self.custom = client.CustomObjectsApi(pods.devcluster.api)
        self.namespace = pods.namespace

    def create(self, name: str, min_member: int) -> dict[str, Any]:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "PodGroup",
            "metadata": {"name": name},
            "spec": {"minMember": min_member},
        }
        created: dict[str, Any] = self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, body
        )
        return created

    def status(self, name: str) -> dict[str, Any]:
        group = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name
        )
        found: dict[str, Any] = group.get("status") or {}
        return found

    def reaches(self, name: str, **expected: object) -> dict[str, Any]:
        """The status once every field in ``expected`` has that value."""

        last: list[dict[str, Any]] = [{}]

        def probe() -> dict[str, Any] | None:
            found = last[0] = self.status(name)
            return found if all(found.get(k) == v for k, v in expected.items()) else None

        try:
            return eventually(probe, what=f"PodGroup {name} status {expected}")
        except pytest.fail.Exception:
            pytest.fail(f"PodGroup {name} status {expected} never came; last seen {last[0]}")


@pytest.fixture
def group_history(pods: Pods) -> Iterator[History]:
    """Every version of the test's PodGroups: the phases each went through, all of them."""
    custom = client.CustomObjectsApi(pods.devcluster.api)
    history = History(custom.list_namespaced_custom_object, GROUP, VERSION, pods.namespace, PLURAL)
    yield history
    history.close()


def _phases(history: History, name: str) -> list[str]:
    """The status phases the PodGroup ``name`` went through, in order."""
    history.caught_up()
    phases: list[str] = []
    for version in history.versions(name):
        phase = (version.get("status") or {}).get("phase")
        if phase and (not phases or phases[-1] != phase):
            phases.append(phase)
    return phases


def _finish(pods: Pods, name: str, phase: str) -> None:
    pods.devcluster.core().patch_namespaced_pod_status(
        name, pods.namespace, {"status": {"phase": phase}}
    )


def _no_api_warnings(scheduler: SchedulerProcess) -> None:
    warned = [line for line in scheduler.log_lines() if line.get("event") == "api_warning"]
    assert warned == []


def test_pod_group_status_from_pending_to_finished(
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    group_history: History,
) -> None:
    pool.add(2, gpus=8)
    groups = Groups(pods)
    created = groups.create("train", 3)
    label = {names.POD_GROUP_LABEL: "train"}
    members = [pods.create(f"train-{i}", gpus=4, labels=label) for i in range(2)]
    scheduler = start_scheduler()

    found = groups.reaches("train", phase="Pending", running=0, succeeded=0, failed=0)
    assert "scheduleStartTime" not in found
    waiting = eventually(
        lambda: [e for e in pods.events(members[0]) if e.reason == "WaitingForMembers"],
        what="a WaitingForMembers Event",
    )
    assert waiting[0].type == "Normal"

    members.append(pods.create("train-2", gpus=4, labels=label))
    found = groups.reaches("train", phase="Running", running=3, succeeded=0, failed=0)
    started = found["scheduleStartTime"]
    created_at = parse_time(created["metadata"]["creationTimestamp"])
    assert parse_time(started) >= created_at
    for name in members:  # the binding replaced the waiting members' condition
        assert pods.condition(name).status == "True"
        assert not [e for e in pods.events(name) if e.type == "Warning"]

    asked = time.monotonic()
    _finish(pods, members[0], "Succeeded")
    groups.reaches("train", phase="Running", running=2, succeeded=1, failed=0)
    figures.record(
        SECTION,
        "seconds from a member's Succeeded to the PodGroup's status saying so",
        round(time.monotonic() - asked, 2),
    )
    for name in members[1:]:
        _finish(pods, name, "Succeeded")
    found = groups.reaches("train", phase="Finished", running=0, succeeded=3, failed=0)

    assert found["scheduleStartTime"] == started
    assert set(found) <= STATUS_FIELDS
    phases = _phases(group_history, "train")
    assert phases == sorted(phases, key=ORDER.index), phases  # never back to an earlier phase
    assert (phases[0], phases[-1]) == ("Pending", "Finished"), phases
    _no_api_warnings(scheduler)


def test_a_failed_member_makes_the_pod_group_failed(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    pool.add(2, gpus=8)
    groups = Groups(pods)
    groups.create("job", 2)
    label = {names.POD_GROUP_LABEL: "job"}
    members = [pods.create(f"job-{i}", gpus=8, labels=label) for i in range(2)]
    scheduler = start_scheduler()
    groups.reaches("job", phase="Running", running=2)

    _finish(pods, members[0], "Failed")
    found = groups.reaches("job", phase="Failed", running=1, succeeded=0, failed=1)
    assert "scheduleStartTime" in found
    _no_api_warnings(scheduler)


def test_a_member_asked_to_leave_does_not_fail_the_pod_group(
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    group_history: History,
) -> None:
    """A running member is deleted (as a reclaim, a shrink or a drain does): its container ends
    Failed while the object is still there (held here by a finalizer, so the state cannot be
    missed). The PodGroup stays Running with the others; it does not turn Failed, a phase that
    is never written again, and it counts the member out once it is gone."""
    pool.add(3, gpus=8)
    groups = Groups(pods)
    groups.create("job", 2)
    label = {names.POD_GROUP_LABEL: "job"}
    members = [pods.create(f"job-{i}", gpus=8, labels=label) for i in range(3)]
    scheduler = start_scheduler()
    groups.reaches("job", phase="Running", running=3)

    core = pods.devcluster.core()
    held = {"metadata": {"finalizers": ["shoal.dev/test-hold"]}}
    core.patch_namespaced_pod(members[2], pods.namespace, held)
    core.delete_namespaced_pod(members[2], pods.namespace)
    eventually(
        lambda: (
            (p := core.read_namespaced_pod(members[2], pods.namespace)).status.phase == "Failed"
            and p.metadata.deletion_timestamp is not None
        ),
        what="the deleted member to end Failed while its object stays",
    )
    found = groups.reaches("job", running=2)
    assert (found["phase"], found["failed"], found["succeeded"]) == ("Running", 0, 0), found
    core.patch_namespaced_pod(members[2], pods.namespace, {"metadata": {"finalizers": None}})
    eventually(
        lambda: members[2] not in {p.metadata.name for p in pods.all()}, what="the member gone"
    )
    groups.reaches("job", phase="Running", running=2, failed=0)
    assert "Failed" not in _phases(group_history, "job")
    _no_api_warnings(scheduler)


def test_members_that_do_not_fit_together_are_told_why_per_node(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    pool.add(2, gpus=8)
    groups = Groups(pods)
    groups.create("big", 3)
    label = {names.POD_GROUP_LABEL: "big"}
    members = [pods.create(f"big-{i}", gpus=8, labels=label) for i in range(3)]
    start_scheduler()

    def told() -> str | None:
        condition = pods.condition(members[0])
        return condition.message if condition is not None else None

    message = eventually(told, what="the members' PodScheduled condition")
    assert message.startswith("only 2 of the 3 member(s) fit at once; 0/")
    assert "nodes are available: " in message
    assert "2 Insufficient nvidia.com/gpu" in message
    assert pods.condition(members[0]).reason == "Unschedulable"
    failed = eventually(
        lambda: [e for e in pods.events(members[0]) if e.reason == "FailedScheduling"],
        what="a FailedScheduling Event",
    )
    assert failed[0].type == "Warning"
    found = groups.reaches("big", phase="Scheduling", running=0)
    assert "scheduleStartTime" in found
    assert pods.bound(members) == {}


def test_a_status_field_the_schema_lacks_is_logged_as_an_api_warning(pods: Pods) -> None:
    """What the scheduler's log is checked for above: the API server accepts the write, prunes
    the field, and says so in a Warning header, which the scheduler logs."""
    groups = Groups(pods)
    groups.create("pruned", 1)
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{pods.namespace}/{PLURAL}/pruned/status"
    body = {"status": {"phase": "Pending", "scheduled": 1}}
    with structlog.testing.capture_logs() as logs:
        Rest(pods.devcluster.api).call(
            "PATCH", path, body, content_type="application/merge-patch+json"
        )
    warned = [line for line in logs if line["event"] == "api_warning"]
    assert len(warned) == 1
    assert "scheduled" in warned[0]["warning"]
    assert groups.status("pruned") == {"phase": "Pending"}
