"""Status writes that never reached the API server are sent again, not taken as told."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from scheduler.k8s.client import ApiError, TokenBucket
from scheduler.k8s.status import ApiReporter
from scheduler.model import Gang, GangKey
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
    assert len(events) == 2
    reporter.close()
