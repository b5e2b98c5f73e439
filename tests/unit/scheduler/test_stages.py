"""Stage changes of a running gang, through the step: a lowered maximum asks the youngest
surplus members to leave through the notice path; a raised minimum with room possible keeps the
gang running and waits; one that the cluster can never meet is released after the notice."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scheduler.cache import Cache
from scheduler.gang import build_gangs
from scheduler.k8s import convert
from scheduler.model import Gang, NodeName, PodRequest
from scheduler.step import Ledgers, Step, StepSettings, step
from tests.unit.scheduler.builders import GIB, SCHED, node, pod, snapshot

SETTINGS = StepSettings(reclaim_grace=30.0, torn_grace=60.0)


def _members(count: int, *, bound: int, gpus: int, **sizes: str) -> list[PodRequest]:
    return [
        pod(
            f"m{i}",
            gang="g",
            gpus=gpus,
            created=float(i),
            node="n0" if i < bound else None,
            min_member=sizes.get("min_member"),
            max_member=sizes.get("max_member"),
        )
        for i in range(count)
    ]


def _run(ledgers: Ledgers, pods: Sequence[PodRequest], now: float, nodes: int = 1) -> Step:
    snap = snapshot([node(f"n{i}", gpus=8) for i in range(nodes)], pods)
    gangs, invalid = build_gangs(pods, {}, SCHED)
    assert invalid == []
    return step(ledgers, gangs, snap, now)


def _decide(this: Step) -> list[Gang]:
    return [o.decision.gang for o in this.outcomes]


def test_a_lowered_maximum_asks_the_youngest_surplus_to_leave_once_never_below_it() -> None:
    ledgers = Ledgers(SETTINGS)
    pods = _members(4, bound=4, gpus=2, min_member="1", max_member="2")
    first = _run(ledgers, pods, now=100.0)
    (shrink,) = first.opening.shrunk
    assert sorted(p.name for p in shrink.asked) == ["m2", "m3"]  # the youngest two
    assert shrink.leave_by == 130.0
    assert ledgers.reclaims.reserved() == {}  # no room is held for a shrink
    # Asked once: the next step asks nobody again, and evicts them at their leave-by only.
    again = _run(ledgers, pods, now=110.0)
    assert again.opening.shrunk == () or all(not s.asked for s in again.opening.shrunk)
    assert again.opening.evict == ()
    due = _run(ledgers, pods, now=130.0)
    assert sorted(p.name for p in due.opening.evict) == ["m2", "m3"]


def test_members_patched_one_at_a_time_ask_nobody_until_they_agree() -> None:
    ledgers = Ledgers(SETTINGS)
    pods = _members(4, bound=4, gpus=2, min_member="1", max_member="4")
    pods[0] = pod("m0", gang="g", gpus=2, node="n0", min_member="1", max_member="2")
    assert _run(ledgers, pods, now=0.0).opening.shrunk == ()


def test_a_raised_minimum_that_can_fit_keeps_the_gang_running_and_says_what_it_waits_for() -> None:
    ledgers = Ledgers(SETTINGS)
    # Two nodes: the gang (2 of 4 GPUs each) on n0; a blocker that cannot be reclaimed on n1.
    blocker = [pod(f"b{i}", gang="b", gpus=4, node="n1", priority=10) for i in range(2)]
    before = _members(4, bound=2, gpus=4, min_member="2", max_member="4")
    for now in (0.0, 1.0):
        _decide(_run(ledgers, before + blocker, now, nodes=2))
    raised = _members(4, bound=2, gpus=4, min_member="4", max_member="4")
    said: list[str] = []
    for now in (2.0, 30.0, 100.0, 1000.0):
        this = _run(ledgers, raised + blocker, now, nodes=2)
        assert this.opening.released == ()
        assert this.opening.told == ()
        outcomes = list(this.outcomes)
        assert all(o.told is None for o in outcomes)
        said.extend(o.unplaced.message for o in outcomes if o.unplaced is not None)
    assert said, "the gang's pending members are told what it waits for"
    assert all("below its raised minimum 4" in text for text in said), said
    assert all("waits for room for 2 more" in text for text in said), said
    # Room appears (the blocker finished, which ends every backoff): the rest bind.
    ledgers.freed()
    this = _run(ledgers, raised, 1001.0, nodes=2)
    (outcome,) = list(this.outcomes)
    assert sorted(p.name for p, _ in outcome.binds) == ["m2", "m3"]


def test_a_raised_minimum_the_cluster_can_never_meet_is_released_after_the_notice() -> None:
    ledgers = Ledgers(SETTINGS)
    before = _members(3, bound=2, gpus=4, min_member="2", max_member="3")
    _decide(_run(ledgers, before, 0.0))
    raised = _members(3, bound=2, gpus=4, min_member="3", max_member="3")  # 12 GPUs on 8
    told = [o.told for o in _run(ledgers, raised, 1.0).outcomes if o.told is not None]
    assert told, "a release the bounds make unavoidable is announced first"
    release = _run(ledgers, raised, 1.0 + 60.0).opening.released
    assert [sorted(p.name for p in r.asked) for r in release] == [["m0", "m1"]]


def _resized(spec_cpu: str, allocated_cpu: str, actual_cpu: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "r", "uid": "u"},
        "spec": {
            "nodeName": "n0",
            "containers": [
                {"name": "main", "resources": {"requests": {"cpu": spec_cpu, "memory": "1Gi"}}}
            ],
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "main",
                    "allocatedResources": {"cpu": allocated_cpu, "memory": "1Gi"},
                    "resources": {"requests": {"cpu": actual_cpu, "memory": "2Gi"}},
                }
            ],
        },
    }


def test_a_resize_in_flight_is_counted_at_the_largest_of_spec_allocated_and_actual() -> None:
    # A downsize the kubelet has not applied: still counted at what it runs with.
    down = convert.pod(_resized("10", "50", "50"))
    assert (down.requests.cpu_milli, down.requests.memory) == (50_000, 2 * GIB)
    assert not convert.resize_pending(_resized("10", "50", "50"))
    # An upsize not allocated yet: counted at the spec already, and pending.
    up = convert.pod(_resized("80", "50", "50"))
    assert up.requests.cpu_milli == 80_000
    assert convert.resize_pending(_resized("80", "50", "50"))


def test_a_node_whose_pods_are_counted_for_more_than_it_has_says_by_how_much() -> None:
    cache = Cache()
    cache.set_node(node("n0", cpu=96))
    cache.set_pod(convert.pod(_resized("80", "50", "50")))
    assert cache.overcommitted(NodeName("n0")) is None
    other = pod("o", cpu_milli=40_000, node="n0")
    cache.set_pod(other)
    over = cache.overcommitted(NodeName("n0"))
    assert over is not None
    assert over.cpu_milli == 24_000
