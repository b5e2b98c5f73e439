"""Gangs on a real API server: all or nothing, in priority and age order, never starved."""

from __future__ import annotations

import time
from collections.abc import Callable

from tests.integration.conftest import Devcluster
from tests.integration.scheduler.conftest import Pods, Pool, SchedulerProcess, ensure_priority_class
from tests.waiting import eventually


def _next_second(pods: Pods, name: str) -> None:
    """Wait until the clock is past the second ``name`` was created in (creation timestamps have
    one-second resolution), so that what is created next is strictly younger."""
    created = pods.read(name).metadata.creation_timestamp.timestamp()
    eventually(lambda: time.time() >= created + 1, timeout=5, interval=0.05, what="a new second")


def test_competing_gangs_one_bound_whole_other_waits_then_follows(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    pool.add(2, gpus=8)
    # Created in the same second or not, "first" goes first: age, then name.
    first = pods.gang("first", 2, gpus=8)
    second = pods.gang("second", 2, gpus=8)
    start_scheduler()

    eventually(lambda: len(pods.bound(first)) == 2, what="the older gang to be bound")
    assert pods.bound(second) == {}
    assert len(set(pods.bound(first).values())) == 2

    def explained() -> str | None:
        condition = pods.condition(second[0])
        return condition.message if condition is not None else None

    message = eventually(explained, what="the waiting gang's PodScheduled condition")
    assert pods.condition(second[0]).status == "False"
    assert pods.condition(second[0]).reason == "Unschedulable"
    assert "nodes are available" in message
    assert "2 Insufficient nvidia.com/gpu" in message
    eventually(
        lambda: any(e.reason == "FailedScheduling" for e in pods.events(second[0])),
        what="a FailedScheduling Event on the waiting gang's first member",
    )
    # One Event for the gang, not one per member; the second member has its condition.
    assert not any(e.reason == "FailedScheduling" for e in pods.events(second[1]))
    assert pods.condition(second[1]).reason == "Unschedulable"

    pods.delete(first)  # the first job finishes and its pods go away
    eventually(lambda: len(pods.bound(second)) == 2, what="the second gang after the first left")


def test_higher_priority_gang_wins_over_an_older_one(
    devcluster: Devcluster,
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
) -> None:
    ensure_priority_class(devcluster, "shoal-test-high", 100000)
    pool.add(1, gpus=8)
    old = pods.gang("old-low", 2, gpus=4)  # older or of the same age: priority wins anyway
    urgent = pods.gang("young-high", 2, gpus=4, priority_class="shoal-test-high")
    start_scheduler()
    eventually(lambda: len(pods.bound(urgent)) == 2, what="the high-priority gang")
    assert pods.bound(old) == {}


def test_equal_priority_older_gang_wins(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    pool.add(1, gpus=8)
    # Names sort the other way round, so only age can make "zz-old" win.
    old = pods.gang("zz-old", 2, gpus=4)
    _next_second(pods, old[0])
    young = pods.gang("aa-young", 2, gpus=4)
    start_scheduler()
    eventually(lambda: len(pods.bound(old)) == 2, what="the older gang")
    assert pods.bound(young) == {}


def test_gang_short_of_its_minimum_never_binds_and_plain_pods_still_do(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    pool.add(1, gpus=8)
    short = pods.gang("short", 2, gpus=1, min_member=3)
    start_scheduler()
    plain = pods.create("plain", gpus=1)

    eventually(lambda: pods.node_of(plain), what="the plain pod behind the short gang")

    def explained() -> str | None:
        condition = pods.condition(short[0])
        return condition.message if condition is not None else None

    message = eventually(explained, what="the short gang's condition")
    assert "has 2 of the 3 members its minimum needs" in message
    assert pods.bound(short) == {}
    # The third member arrives: now the whole minimum goes at once.
    pods.create(
        "short-2",
        gpus=1,
        labels={"shoal.dev/gang": "short"},
        annotations={"shoal.dev/min-member": "3"},
    )
    eventually(lambda: len(pods.bound([*short, "short-2"])) == 3, what="the completed gang")


def test_gang_that_can_never_fit_does_not_starve_a_small_one(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    pool.add(2, gpus=8)
    huge = pods.gang("huge", 4, gpus=8)  # needs 4 nodes, there are 2; first by age and name
    small = pods.gang("small", 2, gpus=2)
    start_scheduler()
    eventually(lambda: len(pods.bound(small)) == 2, what="the small gang behind the huge one")
    assert pods.bound(huge) == {}
