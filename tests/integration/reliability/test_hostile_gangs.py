"""Gangs that a user (or a bad day) breaks, on the devcluster: the rest of the cluster goes on.

- A pod whose ``shoal.dev/min-member`` is ``"+-1"`` once made every cycle raise, so no gang in
  the cluster bound; now it is an invalid gang with an Event, and a normal gang beside it binds.
- Members deleted right after their gang was created, or a node deleted while a gang binds,
  once left gangs bound below their minimum forever with no word; now the gang is told at once
  and its bound members are released after the grace.
- A 16-member gang's queued "unschedulable" condition writes once landed after its binding,
  so bound pods said ``PodScheduled=False``; now no bound pod does, 10 s after the bind.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from contracts import names
from tests import figures
from tests.integration.conftest import Devcluster
from tests.integration.history import History
from tests.integration.scheduler.conftest import Pods, Pool, SchedulerProcess
from tests.waiting import eventually

pytestmark = pytest.mark.reliability

SECTION = "hostile gangs"


def _reasons(pods: Pods, name: str) -> set[str]:
    return {e.reason for e in pods.events(name)}


def test_a_plus_minus_one_min_member_pod_stops_no_other_gang(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    pool.add(2, gpus=8)
    sched = start_scheduler()
    bad = pods.gang("bad", 2, gpus=1, min_member="+-1")
    worse = pods.gang("worse", 1, gpus=1, min_member="--1", max_member="+-1")
    started = time.monotonic()
    good = pods.gang("good", 4, gpus=2, min_member=4)
    eventually(lambda: len(pods.bound(good)) == 4, timeout=5, what="the normal gang to bind")
    figures.record(
        SECTION, "normal gang bound beside a '+-1' gang (s)", round(time.monotonic() - started, 2)
    )

    def told(name: str) -> Any:
        condition = pods.condition(name)
        return condition is not None and condition.reason == "InvalidGang" and condition

    condition = eventually(lambda: told(bad[0]), timeout=10, what="the bad gang's condition")
    assert "shoal.dev/min-member" in condition.message
    assert "+-1" in condition.message
    eventually(lambda: told(worse[0]), timeout=10, what="the '--1' gang's condition")
    eventually(
        lambda: "InvalidGang" in _reasons(pods, bad[0]), timeout=10, what="an InvalidGang Event"
    )
    assert pods.bound(bad + worse) == {}
    assert sched.get("/healthz")[0] == 200
    crashed = [line for line in sched.log_lines() if line.get("event") == "cycle_crashed"]
    assert crashed == []


def _below_minimum_told(pods: Pods, names_: list[str]) -> bool:
    return any("GangBelowMinimum" in _reasons(pods, n) for n in names_)


def _ever_bound(history: History, names_: list[str]) -> dict[str, set[str]]:
    """The nodes each of ``names_`` was ever bound to, from every version of the pods."""
    found: dict[str, set[str]] = {}
    for state in history.states():
        for name in names_:
            if name in state and state[name].spec.node_name:
                found.setdefault(name, set()).add(state[name].spec.node_name)
    return found


def test_deleted_members_leave_no_gang_below_its_minimum_without_an_event(
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    pod_history: History,
) -> None:
    pool.add(8, gpus=8)
    # Slow binds (2 per second) so that members can be deleted between the decision and
    # their binding, as a user deleting a job half-way, or a controller replacing pods, does.
    start_scheduler("--qps", "2", "--burst", "1", "--torn-grace", "15")
    members = pods.gang("torn", 8, gpus=8, min_member=8)
    eventually(lambda: pods.bound(members), timeout=30, interval=0.05, what="a first bind")
    gone = [m for m in members if m not in pods.bound(members)][-2:]
    pods.delete(gone)
    left = [m for m in members if m not in gone]
    started = time.monotonic()
    # The binds of the deleted members fail; the rest land. Which landed is read from every
    # version of the pods, whenever the test looks.
    eventually(
        lambda: _below_minimum_told(pods, list(_ever_bound(pod_history, left))),
        timeout=30,
        what="a GangBelowMinimum Event on the torn gang",
    )
    told = time.monotonic() - started
    eventually(
        lambda: not pods.bound(left) or None,
        timeout=60,
        what="the torn gang's bound members to be released",
    )
    released = time.monotonic() - started
    pod_history.caught_up()
    bound = _ever_bound(pod_history, left)
    assert 0 < len(bound) < 8, bound
    eventually(
        lambda: any("GangReleased" in _reasons(pods, n) for n in bound),
        timeout=30,
        what="a GangReleased Event on the released members",
    )
    figures.record(SECTION, "torn by deletion: told after (s)", round(told, 1))
    figures.record(SECTION, "torn by deletion: released after (s, grace 15 s)", round(released, 1))


def test_a_node_deleted_while_its_gang_binds_gets_no_binding_and_the_gang_is_resolved(
    devcluster: Devcluster,
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    pod_history: History,
) -> None:
    nodes_ = pool.add(8, gpus=8)
    scheduler = start_scheduler("--qps", "2", "--burst", "1", "--torn-grace", "15")
    members = pods.gang("split", 8, gpus=8, min_member=8)
    first = eventually(lambda: pods.bound(members), timeout=30, interval=0.05, what="a bind")
    keep = set(first.values())
    deleted = [n for n in nodes_ if n not in keep]
    core = devcluster.core()
    gone: dict[str, float] = {}  # when each node's deletion was answered (time.monotonic())

    def delete(name: str) -> None:
        try:
            core.delete_node(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
        gone[name] = time.monotonic()

    # All at once: one by one, on a loaded machine, the scheduler went on binding (rightly) to
    # the nodes not yet deleted.
    with ThreadPoolExecutor(len(deleted)) as deleting:
        list(deleting.map(delete, deleted))
    deleted_at = time.monotonic()
    eventually(
        lambda: _below_minimum_told(pods, list(_ever_bound(pod_history, members))),
        timeout=30,
        what="a GangBelowMinimum Event after the node went",
    )
    told = time.monotonic() - deleted_at
    eventually(
        lambda: not pods.bound(members) or None,
        timeout=90,
        what="the torn gang's members to be released or collected",
    )
    # A bind may have been on the wire while the nodes went; none may start after that: read
    # from every version of the pods, so that no binding is missed however briefly it lasted.
    # A binding counts if it arrived after its node's deletion was answered (one made before
    # is a pod on a node that then went, as any node loss makes) and after the scheduler showed
    # it had heard of the deletions (it refused its first bind to a deleted node): until its
    # watch brings the deletion, a scheduler cannot know, and beside another test run that took
    # over a second, two paced binds.
    pod_history.caught_up()
    heard = _first_refusal(scheduler)

    def late_on(pod: str, node: str) -> bool:
        at = pod_history.when(pod, lambda obj: obj.spec.node_name == node)
        return at is not None and at > gone[node] and (heard is None or at > heard)

    late = {
        p: on
        for p, bound in _ever_bound(pod_history, members).items()
        if (on := {n for n in bound & set(deleted) if late_on(p, n)})
    }
    assert len(late) <= 1, late
    figures.record(SECTION, "torn by node deletion: told after (s)", round(told, 1))
    figures.record(SECTION, "torn by node deletion: binds to deleted nodes", len(late))


def _first_refusal(scheduler: SchedulerProcess) -> float | None:
    """When (``time.monotonic()``) the scheduler first refused a bind because its node was gone
    (its ``bind_failed`` log line), if it did."""
    offset = time.time() - time.monotonic()
    times = [
        datetime.fromisoformat(line["timestamp"]).timestamp() - offset
        for line in scheduler.log_lines()
        if line.get("event") == "bind_failed" and "no longer exists" in str(line.get("error"))
    ]
    return min(times, default=None)


def test_no_bound_pod_says_unschedulable_after_its_gang_binds(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    pool.add(4, gpus=8)
    start_scheduler()
    stale = 0
    for run in range(3):
        # Members arrive one by one: each arrival rewrites the waiting members' conditions
        # ("k of 16 exist"), so writes are queued when the last one arrives and the gang binds.
        name = f"big{run}"
        members = [
            pods.create(
                f"{name}-{i}",
                gpus=2,
                labels={names.GANG_LABEL: name},
                annotations={names.MIN_MEMBER_ANNOTATION: "16"},
            )
            for i in range(16)
        ]
        eventually(
            lambda m=members: len(pods.bound(m)) == 16,  # type: ignore[misc]
            timeout=30,
            what=f"gang {name}",
        )
        time.sleep(10)
        wrong = []
        for member in members:
            condition = pods.condition(member)
            if condition is None or condition.status != "True":
                wrong.append((member, condition and condition.reason))
        stale += len(wrong)
        assert wrong == [], wrong
        pods.delete(members)
        eventually(
            lambda m=members: not pods.bound(m) or None,  # type: ignore[misc]
            timeout=30,
            what="cleanup",
        )
    figures.record(SECTION, "bound pods saying PodScheduled=False 10 s after bind (3 runs)", stale)


def test_a_large_waiting_gang_writes_a_few_events_not_one_per_member(
    devcluster: Devcluster, pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    pool.add(1, gpus=8)
    start_scheduler()
    members = [
        pods.create(
            f"wide-{i}",
            gpus=1,
            labels={names.GANG_LABEL: "wide"},
            annotations={names.MIN_MEMBER_ANNOTATION: "200"},
        )
        for i in range(200)
    ]
    time.sleep(15)
    events = devcluster.core().list_namespaced_event(pods.namespace).items
    # While its members are being created the gang waits for them: Normal WaitingForMembers,
    # not FailedScheduling warnings.
    told = [e for e in events if e.reason in ("FailedScheduling", "WaitingForMembers")]
    figures.record(SECTION, "scheduling Events for a waiting 200-member gang in 15 s", len(told))
    assert 1 <= len(told) <= 4, len(told)
    assert all(e.type == "Normal" for e in told if e.reason == "WaitingForMembers")
    condition = pods.condition(members[-1])
    assert condition is not None
    assert condition.reason == "Unschedulable"
    assert "200 member(s)" in condition.message
