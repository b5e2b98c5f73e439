"""Status writes that never reached the API server are sent again, not taken as told."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from scheduler.gang.group_status import GroupStatus
from scheduler.k8s.client import ApiError, TokenBucket
from scheduler.k8s.status import ApiReporter
from scheduler.model import Gang, GangKey, PodGroup
from tests.unit.scheduler.builders import SCHED, pod


def _reporter(**kwargs: Any) -> ApiReporter:
    api = SimpleNamespace(configuration=SimpleNamespace(host="https://api.invalid"))
    return ApiReporter(api, TokenBucket(0, 1), SCHED, **kwargs)


def _gang() -> tuple[Gang, Any]:
    member = pod("a", gang="g", min_member="1")
    gang = Gang(
        key=GangKey("ns/g"),
        namespace="ns",
        name="g",
        min_member=1,
        max_member=1,
        members=(member,),
        priority=0,
        created=0.0,
    )
    return gang, member


def test_a_write_dropped_for_a_full_backlog_is_sent_on_the_next_cycle() -> None:
    reporter = _reporter(max_backlog=0)
    gang, member = _gang()
    reporter.unschedulable(gang, [member], "0/4 nodes are available")
    assert reporter.dropped == 2  # the condition and the Event
    reporter.unschedulable(gang, [member], "0/4 nodes are available")
    assert reporter.dropped == 4  # tried again: nothing was told the first time
    reporter.close()


def _settle(reporter: ApiReporter) -> None:
    deadline = time.monotonic() + 10
    while reporter.backlog and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_failed_write_is_sent_again_and_a_sent_one_is_not() -> None:
    reporter = _reporter()
    gang, member = _gang()
    conditions: list[str] = []
    events: list[str] = []
    fail = [True]

    def condition(*args: Any) -> None:
        conditions.append("tried")
        if fail[0]:
            raise ApiError(500, "InternalError", "etcdserver: request timed out")

    reporter._pod_condition = condition  # type: ignore[method-assign,assignment]
    reporter._pod_event = lambda *args: events.append("sent")  # type: ignore[method-assign]
    reporter.unschedulable(gang, [member], "no room")
    _settle(reporter)
    assert conditions == ["tried"]
    fail[0] = False
    reporter.unschedulable(gang, [member], "no room")  # the condition never landed: again
    _settle(reporter)
    assert conditions == ["tried", "tried"]
    reporter.unschedulable(gang, [member], "no room")  # now told: not written a third time
    _settle(reporter)
    assert conditions == ["tried", "tried"]
    assert len(events) == 1  # the gang's Event landed the first time
    reporter.close()


def test_a_large_gang_gets_one_event_per_reason_per_interval_and_a_condition_per_member() -> None:
    now = [0.0]
    reporter = _reporter(event_interval=30.0, clock=lambda: now[0])
    members = tuple(pod(f"w{i}", gang="big", min_member="2000") for i in range(2000))
    gang = Gang(
        key=GangKey("ns/big"),
        namespace="ns",
        name="big",
        min_member=2000,
        max_member=2000,
        members=members,
    )
    conditions: list[str] = []
    events: list[tuple[str, str]] = []
    reporter._pod_condition = lambda pod, *a: conditions.append(pod.name)  # type: ignore[method-assign]
    reporter._pod_event = lambda pod, kind, reason, message: events.append((pod.name, message))  # type: ignore[method-assign]
    for cycle in range(20):  # the count changes every cycle, within one interval
        now[0] = cycle * 1.0
        reporter.unschedulable(gang, members, f"{cycle} of 2000 members exist")
    _settle(reporter)
    assert events == [("w0", "0 of 2000 members exist")]
    now[0] = 31.0
    reporter.unschedulable(gang, members, "20 of 2000 members exist")
    _settle(reporter)
    assert events[1:] == [("w0", "20 of 2000 members exist")]
    assert len(set(conditions)) == 2000  # every member says why it waits
    # ... and learns the newer count at most every 10 s (at 0, 10 and 31 s), not every cycle.
    assert len(conditions) == 3 * 2000
    reporter.close()


def test_a_gang_waiting_for_members_gets_a_normal_event_and_one_that_does_not_fit_a_warning() -> (
    None
):
    reporter = _reporter()
    gang, member = _gang()
    events: list[tuple[str, str]] = []
    reporter._pod_condition = lambda *a: None  # type: ignore[method-assign]
    reporter._pod_event = lambda pod, kind, reason, message: events.append((kind, reason))  # type: ignore[method-assign]
    reporter.unschedulable(gang, [member], "waiting for 1 more member(s)", waiting=True)
    reporter.unschedulable(gang, [member], "0/4 nodes are available", waiting=False)
    _settle(reporter)
    assert sorted(events) == [("Normal", "WaitingForMembers"), ("Warning", "FailedScheduling")]
    reporter.close()


def test_pod_group_status_is_written_once_per_change_on_that_group_only() -> None:
    reporter = _reporter()
    writes: list[tuple[str, str, dict[str, Any]]] = []
    reporter._write_group = lambda ref, write: writes.append((ref, write.uid, dict(write.status)))  # type: ignore[method-assign,union-attr]
    group = PodGroup("ns", "g", 2, uid="u1")
    reporter.group_status(group, GroupStatus("Scheduling", schedule_start=0.0))
    reporter.group_status(group, GroupStatus("Scheduling", schedule_start=0.0))
    reporter.group_status(group, GroupStatus("Running", running=2, schedule_start=0.0))
    _settle(reporter)
    assert [w[2]["phase"] for w in writes] == ["Scheduling", "Running"]
    assert {w[1] for w in writes} == {"u1"}
    assert writes[1][2] == {
        "phase": "Running",
        "running": 2,
        "succeeded": 0,
        "failed": 0,
        "scheduleStartTime": "1970-01-01T00:00:00Z",
    }
    reporter.close()


def test_an_older_pod_group_status_never_lands_after_a_newer_one() -> None:
    reporter = _reporter(workers=4)
    landed: list[int] = []
    first_started = threading.Event()
    release = threading.Event()

    def slow(ref: str, write: Any) -> None:
        if not landed and not first_started.is_set():
            first_started.set()
            release.wait(5)  # the first write is slow: the later ones are queued meanwhile
        landed.append(write.status["running"])

    reporter._write_group = slow  # type: ignore[method-assign]
    group = PodGroup("ns", "g", 3, uid="u1")
    reporter.group_status(group, GroupStatus("Scheduling", running=1))
    assert first_started.wait(5)
    reporter.group_status(group, GroupStatus("Scheduling", running=2))
    reporter.group_status(group, GroupStatus("Running", running=3))
    release.set()
    _settle(reporter)
    assert landed[-1] == 3
    assert landed in ([1, 3], [1, 2, 3])
    reporter.close()


def _k8s_member(name: str) -> Any:
    return replace(pod(name, node="n1"), scheduling_group="low")


def test_reclaiming_members_of_a_kubernetes_pod_group_marks_it_a_disruption_target() -> None:
    reporter = _reporter()
    writes: list[tuple[str, dict[str, Any]]] = []
    reporter._write_group = lambda ref, write: writes.append((ref, dict(write.condition)))  # type: ignore[method-assign,union-attr]
    preemptor = Gang(
        key=GangKey("ns/k8s/high"),
        namespace="ns",
        name="high",
        min_member=2,
        max_member=2,
        members=(),
        priority=100,
        pod_group="ns/k8s/high",
    )
    for name in ("w0", "w1"):  # two members of one group: one write
        reporter.asked_to_leave(_k8s_member(name), preemptor, leave_by=100.0)
    reporter.asked_to_leave(pod("plain", node="n1"), preemptor, leave_by=100.0)  # no PodGroup
    _settle(reporter)
    assert writes == [
        (
            "ns/k8s/low",
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "PreemptionByScheduler",
                "message": f"{SCHED}: preempting to accommodate a higher priority podgroup",
            },
        )
    ]
    reporter.close()


def test_the_disruption_write_does_not_displace_a_pending_scheduled_condition() -> None:
    """Both conditions of one PodGroup are newest-wins each; neither replaces the other."""
    reporter = _reporter(workers=4)
    landed: list[str] = []
    started = threading.Event()
    release = threading.Event()

    def slow(ref: str, write: Any) -> None:
        if not started.is_set():
            started.set()
            release.wait(5)
        landed.append(f"{write.condition['type']}={write.condition['status']}")

    reporter._write_group = slow  # type: ignore[method-assign]
    member = _k8s_member("w0")
    waiting = Gang(GangKey("ns/k8s/low"), "ns", "low", 2, 2, (member,), pod_group="ns/k8s/low")
    reporter.gang_status(waiting)  # False: 1 of 2 bound
    assert started.wait(5)
    bound = Gang(
        GangKey("ns/k8s/low"),
        "ns",
        "low",
        1,
        2,
        (member,),
        pod_group="ns/k8s/low",
    )
    reporter.gang_status(bound)  # True, queued behind the slow write
    single = Gang(GangKey("ns/one"), "ns", "one", 1, 1, (pod("one"),), priority=5)
    reporter.asked_to_leave(member, single, leave_by=1.0)
    release.set()
    _settle(reporter)
    assert landed[0] == "PodGroupInitiallyScheduled=False"
    assert sorted(landed[1:]) == ["DisruptionTarget=True", "PodGroupInitiallyScheduled=True"]
    reporter.close()


def _torn_gang(*members: Any) -> Gang:
    return Gang(
        key=GangKey("ns/t"),
        namespace="ns",
        name="t",
        min_member=4,
        max_member=4,
        members=members,
        pod_group="ns/t",
        pod_group_uid="uid-group",
    )


def test_a_torn_gang_is_explained_on_its_surviving_members_and_its_pod_group() -> None:
    reporter = _reporter()
    events: list[tuple[str, str]] = []
    reporter._pod_event = lambda pod, kind, reason, message: events.append((pod.name, message))  # type: ignore[method-assign]
    reporter._group_event = lambda ref, kind, reason, message, uid: events.append((ref, message))  # type: ignore[method-assign]
    going = replace(pod("t0", pod_group="t", node="n0"), deleting=True)
    left = [pod(f"t{i}", pod_group="t", node=f"n{i}") for i in (1, 2)]
    reporter.torn(_torn_gang(going, *left), 1_800_000_000.0)
    _settle(reporter)
    told = {name for name, _ in events}
    assert told == {"t1", "t2", "ns/t"}  # never on the member being deleted
    assert all("2 of 4 bound, 0 pending" in m for _, m in events)
    reporter.torn(_torn_gang(going, *left), 1_800_000_000.0)  # called again: said already
    _settle(reporter)
    assert len(events) == 3
    reporter.torn(_torn_gang(left[1]), 1_800_000_000.0)  # t1 went too
    _settle(reporter)
    assert sorted(name for name, m in events[3:]) == ["ns/t", "t2"]
    assert all("1 of 4 bound" in m for _, m in events[3:])
    reporter.released(_torn_gang(left[1]), 1_799_999_940.0, 1_800_000_030.0)
    _settle(reporter)
    assert sorted(name for name, m in events[5:]) == ["ns/t", "t2"]
    assert all("asked to leave by 2027-01-15T08:00:30Z" in m for _, m in events[5:])
    reporter.close()
