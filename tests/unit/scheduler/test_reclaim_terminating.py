"""Room that is already leaving: a pod already deleting counts like a victim already asked to
leave. The waiting gang waits for its room instead of asking another gang's pod to leave.

Kueue releases a preempted workload's quota while its pods are still in their grace period
(docs/kueue.md), so the preemptor reaches Shoal before the room frees. The reclaim once chose a
bound lower-priority gang as its victim although the terminating pod's room was enough a grace
period later.
"""

from __future__ import annotations

from dataclasses import replace

from scheduler.cache import Cache, Snapshot
from scheduler.cycle import Config, Decision, run_cycle
from scheduler.gang import build_gangs
from scheduler.model import GangKey, NodeName, PodKey, PodRequest, Resources
from scheduler.queue import GangQueue
from tests.unit.scheduler.builders import SCHED, node, pod, snapshot
from tests.unit.scheduler.test_runner import Clock, Recorder, runner

W = GangKey("ns/w")


def decide(snap: Snapshot, *, spent: dict[PodKey, GangKey] | None = None) -> Decision:
    gangs, _ = build_gangs(snap.pods.values(), snap.pod_groups, SCHED)
    reserved = {W: [(NodeName("n2"), Resources(1000, 0, 8, 1))]} if spent else None
    decision = run_cycle(gangs, GangQueue(), snap, 0.0, Config(), spent=spent, reserved=reserved)
    assert decision is not None
    return decision


def preempted(name: str = "old0", on: str = "n0") -> PodRequest:
    """A pod of a workload Kueue preempted: deleted, still in its grace period."""
    return replace(pod(name, gpus=8, node=on, created=1.0), deleting=True)


def low(on: str = "n1") -> PodRequest:
    return pod("low0", gpus=8, gang="low", node=on, priority=0, created=2.0)


def urgent(count: int = 2, gpus: int = 4) -> list[PodRequest]:
    """One 8-GPU gang of priority 10 (``count`` members), waiting."""
    return [
        pod(f"w{i}", gpus=gpus, gang="w", min_member=str(count), priority=10, created=10.0)
        for i in range(count)
    ]


def test_a_gang_waits_for_a_terminating_pods_room_instead_of_taking_a_lower_priority_gang() -> None:
    snap = snapshot([node("n0"), node("n1")], [preempted(), low(), *urgent()])
    decision = decide(snap)
    assert decision.gang.name == "w"
    assert decision.victims == ()
    assert decision.nominated == ()
    assert decision.bindings == ()
    why = decision.unschedulable
    assert why is not None
    assert "waiting for the room 1 pod(s) already terminating will free" in why.message()


def test_the_same_pod_not_deleting_is_room_taken_and_a_victim_is_chosen() -> None:
    running = replace(preempted(), deleting=False)
    snap = snapshot([node("n0"), node("n1")], [running, low(), *urgent()])
    decision = decide(snap)
    assert decision.victims  # nothing is on its way: reclaim takes a priority-0 pod
    assert all(v in {PodKey("ns/old0"), PodKey("ns/low0")} for v in decision.victims)


def test_victims_are_chosen_only_for_what_the_terminating_room_does_not_cover() -> None:
    # 16 GPUs needed: the terminating pod frees n0, so one victim (low0 on n1) is enough; before,
    # no plan was found at all (the deleting pod is no victim, and low0 alone was too little).
    snap = snapshot([node("n0"), node("n1")], [preempted(), low(), *urgent(2, gpus=8)])
    decision = decide(snap)
    assert decision.victims == (PodKey("ns/low0"),)
    assert {a.node for a in decision.nominated} == {NodeName("n0"), NodeName("n1")}


def test_a_gang_may_wait_for_both_a_victim_asked_for_another_gang_and_a_terminating_pod() -> None:
    # e0 (n2) and e1 (n3) were asked to leave for w, which holds n2 only. x needs 16 GPUs: n3
    # once e1 is gone and n0 once the terminating pod is: it waits for both, asking no one.
    nodes = [node(f"n{i}") for i in range(4)]
    held = pod("e0", gpus=8, gang="e", min_member="1", max_member="2", node="n2")
    leaving = pod("e1", gpus=8, gang="e", min_member="1", max_member="2", node="n3", created=1)
    x = [pod(f"x{i}", gpus=8, gang="x", min_member="2", priority=10, created=20) for i in range(2)]
    snap = snapshot(nodes, [preempted(), low(), held, leaving, *x])
    decision = decide(snap, spent={PodKey("ns/e0"): W, PodKey("ns/e1"): W})
    assert decision.gang.name == "x"
    assert decision.victims == ()
    why = decision.unschedulable
    assert why is not None
    assert (
        "waiting for the room 1 pod(s) asked to leave for other gangs and 1 pod(s) already "
        "terminating will free" in why.message()
    )


def test_the_waiting_gang_asks_no_one_and_binds_once_the_terminating_pod_is_gone() -> None:
    cache = Cache()
    for name in ("n0", "n1"):
        cache.set_node(node(name))
    for member in (preempted(), low(), *urgent()):
        cache.set_pod(member)
    recorder, clock = Recorder(), Clock()
    loop = runner(cache, recorder, clock, reclaim_grace=30.0, hold_extra=120.0)
    for _ in range(3):
        loop.run_once()
        clock.now += 5.0
    assert recorder.asked == []
    assert recorder.evicted == []
    assert recorder.bound == []
    assert "already terminating" in recorder.messages["w"]

    cache.remove_pod(PodKey("ns/old0"))  # its grace period is over
    loop.wake(freed=True)
    loop.run_once()
    assert sorted(recorder.bound) == [("w0", "n0"), ("w1", "n0")]
    assert recorder.asked == []  # low0 was never asked to leave
