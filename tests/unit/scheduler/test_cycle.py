"""Cache assume/forget, queue order and backoff, and whole scheduling cycles on plain values."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cache import Cache, Snapshot
from scheduler.cycle import Config, Decision, run_cycle
from scheduler.gang import build_gangs
from scheduler.model import Assignment, Gang, NodeName, PodKey, Resources
from scheduler.queue import GangQueue
from tests.unit.scheduler.builders import SCHED, node, pod, snapshot

CONFIG = Config()


def gangs_of(snap: Snapshot) -> list[Gang]:
    gangs, invalid = build_gangs(snap.pods.values(), snap.pod_groups, SCHED)
    assert invalid == []
    return gangs


def cycle(snap: Snapshot, queue: GangQueue, now: float = 0.0) -> Decision | None:
    return run_cycle(gangs_of(snap), queue, snap, now, CONFIG)


def bound(decision: Decision | None) -> dict[str, str]:
    assert decision is not None
    return {a.pod.split("/")[1]: a.node for a in decision.bindings}


# -- cache -----------------------------------------------------------------------------------


def test_assumed_pod_is_charged_until_forgotten() -> None:
    cache = Cache()
    cache.set_node(node("n", gpus=8))
    cache.set_pod(pod("p", gpus=6))
    cache.assume([Assignment(PodKey("ns/p"), NodeName("n"))], now=0)
    assert cache.snapshot().nodes[NodeName("n")].free.gpu == 2
    assert cache.snapshot().pods[PodKey("ns/p")].node == "n"
    cache.forget(PodKey("ns/p"))
    assert cache.snapshot().nodes[NodeName("n")].free.gpu == 8


def test_watch_confirmation_replaces_the_assumption_without_double_charging() -> None:
    cache = Cache()
    cache.set_node(node("n", gpus=8))
    cache.set_pod(pod("p", gpus=6))
    cache.assume([Assignment(PodKey("ns/p"), NodeName("n"))], now=0)
    cache.set_pod(pod("p", gpus=6))  # an update that still shows it unbound: stays assumed
    assert cache.snapshot().nodes[NodeName("n")].free.gpu == 2
    cache.set_pod(pod("p", gpus=6, node="n"))  # bound
    assert cache.assumed() == {}
    cache.forget(PodKey("ns/p"))  # a late failure report changes nothing
    assert cache.snapshot().nodes[NodeName("n")].free.gpu == 2


def test_unconfirmed_assumption_expires() -> None:
    cache = Cache(assume_ttl=30)
    cache.set_node(node("n"))
    cache.set_pod(pod("p", gpus=8))
    cache.assume([Assignment(PodKey("ns/p"), NodeName("n"))], now=100)
    assert cache.expire(now=129) == []
    assert cache.expire(now=130) == [PodKey("ns/p")]
    assert cache.snapshot().nodes[NodeName("n")].free.gpu == 8


def test_removed_and_finished_pods_free_their_node() -> None:
    cache = Cache()
    cache.set_node(node("n"))
    cache.set_pod(pod("a", gpus=4, node="n"))
    cache.set_pod(pod("b", gpus=4, node="n"))
    cache.remove_pod(PodKey("ns/a"))
    cache.set_pod(replace(pod("b", gpus=4, node="n"), phase="Succeeded"))  # type: ignore[arg-type]
    assert cache.snapshot().nodes[NodeName("n")].free.gpu == 8


# -- queue -----------------------------------------------------------------------------------


def _gang(name: str, priority: int, created: float) -> Gang:
    return Gang(
        key=f"ns/{name}",  # type: ignore[arg-type]
        namespace="ns",
        name=name,
        min_member=1,
        max_member=1,
        members=(),
        priority=priority,
        created=created,
    )


def test_queue_orders_by_priority_then_age_and_skips_backoff() -> None:
    queue = GangQueue(initial_backoff=1, max_backoff=8)
    gangs = [_gang("young", 0, 20), _gang("old", 0, 10), _gang("urgent", 5, 30)]
    assert [g.name for g in queue.ordered(gangs, now=0)] == ["urgent", "old", "young"]
    assert queue.failed(gangs[2].key, now=0) == 1
    assert queue.failed(gangs[2].key, now=1) == 3
    assert [g.name for g in queue.ordered(gangs, now=2)] == ["old", "young"]
    assert next(g.name for g in queue.ordered(gangs, now=3)) == "urgent"
    for _ in range(10):
        until = queue.failed(gangs[2].key, now=100)
    assert until == 108
    queue.wake()
    assert next(g.name for g in queue.ordered(gangs, now=100)) == "urgent"


# -- cycles ----------------------------------------------------------------------------------


def test_competing_gangs_exactly_one_is_bound_whole_and_the_other_explained() -> None:
    nodes = [node(f"n{i}") for i in range(2)]
    older = [pod(f"a{i}", gpus=8, gang="a", created=1) for i in range(2)]
    younger = [pod(f"b{i}", gpus=8, gang="b", created=2) for i in range(2)]
    queue = GangQueue()
    snap = snapshot(nodes, [*older, *younger])
    first = cycle(snap, queue)
    assert first is not None
    assert first.gang.name == "a"
    assert sorted(bound(first)) == ["a0", "a1"]
    snap = snap.with_assignments(first.bindings)
    second = cycle(snap, queue)
    assert second is not None
    assert second.gang.name == "b"
    assert second.bindings == ()
    assert second.unschedulable is not None
    assert second.unschedulable.message() == (
        "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    )


def test_higher_priority_wins_over_age() -> None:
    nodes = [node("n0")]
    pods = [pod("old", gpus=8, created=1), pod("vip", gpus=8, created=2, priority=100)]
    assert bound(cycle(snapshot(nodes, pods), GangQueue())) == {"vip": "n0"}


def test_a_gang_torn_below_its_minimum_is_finished_before_older_gangs() -> None:
    # The scheduler died (or a bind failed) after binding t0 of the gang's minimum of two. An
    # older gang that would fit in the room t1 needs must not take it: t0 would then hold its
    # GPUs half bound for good.
    nodes = [node("n0")]
    older = pod("old", gpus=4, gang="old", created=1)
    torn = [
        pod("t0", gpus=4, gang="torn", min_member="2", created=2, node="n0"),
        pod("t1", gpus=4, gang="torn", min_member="2", created=2),
    ]
    decision = cycle(snapshot(nodes, [older, *torn]), GangQueue())
    assert decision is not None
    assert decision.gang.name == "torn"
    assert bound(decision) == {"t1": "n0"}


def test_a_torn_gang_does_not_jump_ahead_while_it_backs_off() -> None:
    # Its remainder did not fit last time: others get their cycles (room freed ends the
    # backoff, and then it goes first again).
    nodes = [node("n0"), node("n1", gpus=2)]
    torn = [
        pod("t0", gpus=4, gang="torn", min_member="2", created=2, node="n0"),
        pod("t1", gpus=8, gang="torn", min_member="2", created=2),
    ]
    small = pod("small", gpus=2, created=1)
    queue = GangQueue()
    snap = snapshot(nodes, [*torn, small])
    first = cycle(snap, queue)
    assert first is not None
    assert first.gang.name == "torn"
    assert first.unschedulable is not None
    assert set(bound(cycle(snap, queue))) == {"small"}


def test_gang_short_of_its_minimum_binds_nothing_and_plain_pods_still_schedule() -> None:
    nodes = [node("n0")]
    pods = [pod("g0", gang="g", min_member="3", created=1), pod("plain", created=2)]
    queue = GangQueue()
    snap = snapshot(nodes, pods)
    first = cycle(snap, queue)
    assert first is not None
    assert first.gang.name == "g"
    assert first.bindings == ()
    assert first.unschedulable is not None
    assert "has 1 of the 3 members its minimum needs" in first.unschedulable.message()
    assert "waiting for 2 more" in first.unschedulable.message()
    assert "nodes are available" not in first.unschedulable.message()  # no node was tried
    assert bound(cycle(snap, queue)) == {"plain": "n0"}


def test_hopeless_gang_backs_off_and_does_not_starve_a_small_one() -> None:
    nodes = [node("n0")]
    huge = [pod(f"h{i}", gpus=8, gang="huge", created=1) for i in range(4)]
    small = [pod("s0", gpus=1, gang="small", created=2)]
    queue = GangQueue()
    snap = snapshot(nodes, [*huge, *small])
    decisions = [cycle(snap, queue, now=0), cycle(snap, queue, now=0)]
    assert [d.gang.name for d in decisions if d] == ["huge", "small"]
    assert bound(decisions[1]) == {"s0": "n0"}


def test_elastic_gang_gets_its_minimum_then_surplus_when_nothing_else_waits() -> None:
    nodes = [node("od0"), node("od1"), node("spot0", spot=True)]
    elastic = [pod(f"e{i}", gpus=8, gang="e", min_member="2", max_member="4") for i in range(4)]
    decision = cycle(snapshot(nodes, elastic), GangQueue())
    assert decision is not None
    assert decision.min_count == 2
    placed = bound(decision)
    assert len(placed) == 3
    assert placed["e2"] == "spot0"  # surplus on spot, the quorum on on-demand
    assert {placed["e0"], placed["e1"]} == {"od0", "od1"}
    # The fourth member does not fit; the decision says why, for its condition.
    assert decision.surplus_unschedulable is not None
    assert decision.surplus_unschedulable.message() == (
        "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    )


def test_surplus_waits_while_another_gangs_minimum_fits() -> None:
    nodes = [node("n0"), node("n1"), node("n2")]
    elastic = [
        pod(f"e{i}", gpus=8, gang="e", min_member="1", max_member="3", created=1) for i in range(3)
    ]
    # "late" is younger but its minimum (1 pod) fits: surplus must leave it the room.
    late = [pod("l0", gpus=8, gang="late", created=5)]
    queue = GangQueue()
    snap = snapshot(nodes, [*elastic, *late])
    first = cycle(snap, queue)
    assert first is not None
    assert (first.gang.name, first.min_count, len(first.bindings)) == ("e", 1, 1)
    assert first.surplus_held
    snap = snap.with_assignments(first.bindings)
    second = cycle(snap, queue)
    assert second is not None
    assert second.gang.name == "late"
    assert len(second.bindings) == 1
    snap = snap.with_assignments(second.bindings)
    queue.wake()
    third = cycle(snap, queue)
    assert third is not None
    assert (third.gang.name, third.min_count, len(third.bindings)) == ("e", 0, 1)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 4), st.integers(0, 3), st.integers(1, 8), st.integers(0, 2)),
        min_size=1,
        max_size=5,
    ),
    st.integers(1, 5),
)
def test_cycles_never_leave_a_gang_partially_bound_or_a_node_overbooked(
    specs: list[tuple[int, int, int, int]], node_count: int
) -> None:
    """Run cycles to quiescence: every gang ends with 0 or >= min members bound, none above
    max, and no node gives out more GPUs than it has."""
    nodes = [node(f"n{i}", gpus=8) for i in range(node_count)]
    pods = []
    for g, (minimum, extra, gpus, priority) in enumerate(specs):
        size = minimum + extra
        pods += [
            pod(
                f"g{g}-{i}",
                gpus=gpus,
                gang=f"g{g}",
                min_member=str(minimum),
                max_member=str(size),
                priority=priority,
                created=g,
            )
            for i in range(size)
        ]
    snap = snapshot(nodes, pods)
    queue = GangQueue()
    for step in range(50):
        decision = cycle(snap, queue, now=step * 100.0)
        if decision is None:
            break
        snap = snap.with_assignments(decision.bindings)
    for gang in gangs_of(snap):
        assert len(gang.bound) == 0 or gang.min_member <= len(gang.bound) <= gang.max_member
    # What each node gives out, summed from the pods themselves (not from the cache's own
    # accounting), never exceeds what it has, in any resource.
    used: dict[str, Resources] = {}
    for p in snap.pods.values():
        if p.node is not None:
            used[p.node] = used.get(p.node, Resources()) + p.requests
    for name, state in snap.nodes.items():
        assert state.node.allocatable.covers(used.get(name, Resources())), (name, used.get(name))
        assert state.free.covers(Resources()), name


def test_gated_pods_are_not_scheduled_and_hold_their_gang_back() -> None:
    nodes = [node("n0")]
    gated = replace(pod("g1", gang="g", min_member="2"), gated=True)
    snap = snapshot(nodes, [pod("g0", gang="g", min_member="2"), gated, pod("plain", created=5)])
    queue = GangQueue()
    first = cycle(snap, queue)
    assert first is not None
    assert first.bindings == ()
    assert bound(cycle(snap, queue)) == {"plain": "n0"}
