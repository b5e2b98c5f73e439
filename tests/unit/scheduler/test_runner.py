"""The scheduling loop with recording implementations of its two seams and a virtual clock:
assume before bind, forget on failure, reclaim notice then eviction at the deadline."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field, replace
from typing import Any, ParamSpec, TypeVar

from contracts import names
from scheduler.cache import Cache
from scheduler.gang.group_status import GroupStatus
from scheduler.model import (
    Gang,
    GangKey,
    InvalidGang,
    NodeName,
    PodGroup,
    PodKey,
    PodPhase,
    PodRequest,
)
from scheduler.runner import Runner, Settings
from tests.unit.scheduler.builders import SCHED, node, pod

P = ParamSpec("P")
T = TypeVar("T")


class Inline(Executor):
    """Runs work at submit time, so a test sees its effects at once."""

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:
            future.set_exception(exc)
        return future


@dataclass
class Recorder:
    fail: set[str] = field(default_factory=set)
    bound: list[tuple[str, str]] = field(default_factory=list)
    asked: list[tuple[str, float, str]] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    messages: dict[str, str] = field(default_factory=dict)
    invalid_seen: list[str] = field(default_factory=list)
    nominations: dict[str, str] = field(default_factory=dict)
    torn_seen: list[tuple[str, int, float]] = field(default_factory=list)
    released_seen: list[tuple[str, float]] = field(default_factory=list)
    statuses: dict[str, list[GroupStatus]] = field(default_factory=dict)

    # Binder
    def bind(self, pod: PodRequest, node: NodeName) -> str | None:
        if pod.name in self.fail:
            return "409 Conflict: already bound"
        self.bound.append((pod.name, node))
        return None

    def ask_to_leave(self, pod: PodRequest, leave_by: float, gang: GangKey) -> str | None:
        self.asked.append((pod.name, leave_by, gang))
        return None

    def evict(self, pod: PodRequest) -> str | None:
        self.evicted.append(pod.name)
        return None

    # Reporter
    def unschedulable(
        self, gang: Gang, pods: Sequence[PodRequest], message: str, *, waiting: bool = False
    ) -> None:
        self.messages[gang.name] = message
        for p in pods:
            self.messages[p.name] = message

    def scheduled(self, gang: Gang, pod: PodRequest, node: NodeName) -> None:
        pass

    def bind_failed(self, pod: PodRequest, node: NodeName, error: str) -> None:
        self.messages[pod.name] = error

    def asked_to_leave(self, pod: PodRequest, gang: Gang, leave_by: float, why: str = "") -> None:
        pass

    def nominated(self, pod: PodRequest, node: NodeName) -> None:
        self.nominations[pod.name] = node

    def invalid(self, gang: InvalidGang) -> None:
        self.invalid_seen.append(gang.message)

    def group_status(self, group: PodGroup, status: GroupStatus) -> None:
        self.statuses.setdefault(group.name, []).append(status)

    def gang_status(self, gang: Gang) -> None: ...

    def torn(self, gang: Gang, release_at: float) -> None:
        survivors = [p for p in gang.bound if not p.deleting]
        self.torn_seen.append((gang.name, len(survivors), release_at))

    def released(self, gang: Gang, since: float, leave_by: float) -> None:
        self.released_seen.append((gang.name, leave_by))


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def runner(cache: Cache, recorder: Recorder, clock: Clock, **settings: Any) -> Runner:
    return Runner(
        cache,
        recorder,
        recorder,
        Settings(scheduler_name=SCHED, **settings),
        clock=clock,
        executor=Inline(),
    )


def test_binding_failure_is_forgotten_and_retried() -> None:
    cache = Cache()
    cache.set_node(node("n0", gpus=8))
    cache.set_pod(pod("a", gpus=8))
    recorder = Recorder(fail={"a"})
    clock = Clock()
    loop = runner(cache, recorder, clock)
    decision, _ = loop.run_once()
    assert decision is not None
    assert [a.node for a in decision.bindings] == ["n0"]
    assert recorder.messages["a"].startswith("409")
    assert cache.assumed() == {}  # forgotten: n0 is free again
    assert cache.snapshot().nodes[NodeName("n0")].free.gpu == 8
    recorder.fail.clear()
    clock.now += 60
    loop.run_once()
    assert recorder.bound == [("a", "n0")]
    assert cache.assumed() == {PodKey("ns/a"): NodeName("n0")}


def test_reclaimed_pod_gets_its_notice_then_is_evicted_at_the_deadline() -> None:
    cache = Cache()
    for i in range(2):
        cache.set_node(node(f"n{i}"))
    for i in range(2):
        cache.set_pod(
            pod(f"e{i}", gpus=8, gang="e", min_member="1", max_member="2", node=f"n{i}", created=i)
        )
    cache.set_pod(pod("w", gpus=8, created=10))
    recorder = Recorder()
    clock = Clock()
    loop = runner(cache, recorder, clock, reclaim_grace=30.0)
    decision, _ = loop.run_once()
    assert decision is not None
    assert decision.victims == (PodKey("ns/e1"),)
    assert recorder.asked == [("e1", clock.now + 30.0, "ns/pod:w")]
    assert recorder.nominations == {"w": "n1"}
    # The API server now shows the notice; before the deadline nothing is evicted.
    notes = {names.LEAVE_BY_ANNOTATION: "x", names.RECLAIMED_FOR_ANNOTATION: "ns/pod:w"}
    e1 = pod("e1", gpus=8, gang="e", min_member="1", max_member="2", node="n1", created=1)
    cache.set_pod(replace(e1, annotations={**e1.annotations, **notes}))
    clock.now += 29
    loop.run_once()
    assert recorder.evicted == []
    assert "waiting for 1 pod(s) asked to leave" in recorder.messages["pod:w"]
    clock.now += 1
    loop.run_once()
    assert recorder.evicted == ["e1"]
    # It leaves; the waiting pod takes the held node.
    cache.remove_pod(PodKey("ns/e1"))
    loop.wake(freed=True)
    loop.run_once()
    assert recorder.bound == [("w", "n1")]


def test_a_victim_that_takes_its_time_to_terminate_does_not_keep_the_loop_busy() -> None:
    cache = Cache()
    for i in range(2):
        cache.set_node(node(f"n{i}"))
    for i in range(2):
        cache.set_pod(
            pod(f"e{i}", gpus=8, gang="e", min_member="1", max_member="2", node=f"n{i}", created=i)
        )
    cache.set_pod(pod("w", gpus=8, created=10))
    recorder = Recorder()
    clock = Clock()
    loop = runner(cache, recorder, clock, reclaim_grace=30.0, hold_extra=120.0)
    loop.run_once()
    clock.now += 30
    loop.run_once()
    assert recorder.evicted == ["e1"]
    # The eviction was accepted; the pod terminates for a while. With nothing else to do, the
    # loop sleeps until the waiting gang's backoff ends, not until a deadline already past.
    e1 = pod("e1", gpus=8, gang="e", min_member="1", max_member="2", node="n1", created=1)
    cache.set_pod(replace(e1, deleting=True))
    clock.now += 0.5
    decision, next_at = loop.run_once()
    assert decision is None
    assert next_at is not None
    assert next_at > clock.now
    assert recorder.evicted == ["e1"]


def test_invalid_gangs_are_reported_and_do_not_stop_the_others() -> None:
    cache = Cache()
    cache.set_node(node("n0"))
    cache.set_pod(pod("bad", gang="g", min_member="0"))
    cache.set_pod(pod("good", created=5))
    recorder = Recorder()
    loop = runner(cache, recorder, Clock())
    loop.run_once()
    assert recorder.bound == [("good", "n0")]
    assert any("must be at least 1, got 0" in m for m in recorder.invalid_seen)


def test_one_cycle_decides_gangs_in_turn_on_the_room_the_earlier_ones_left() -> None:
    cache = Cache()
    for i in range(2):
        cache.set_node(node(f"n{i}", gpus=8))
    # Three gangs of two 4-GPU pods and room for two of them: one cycle places the first two
    # (never the same GPUs twice) and reports the third unschedulable.
    for g in ("a", "b", "c"):
        for i in range(2):
            cache.set_pod(pod(f"{g}{i}", gpus=4, gang=g, min_member="2", created=ord(g)))
    recorder = Recorder()
    loop = runner(cache, recorder, Clock())
    decision, _ = loop.run_once()
    assert decision is not None
    assert decision.gang.name == "a"
    per_node: dict[str, int] = {}
    for _, where in recorder.bound:
        per_node[where] = per_node.get(where, 0) + 4
    assert sorted(name for name, _ in recorder.bound) == ["a0", "a1", "b0", "b1"]
    assert all(used <= 8 for used in per_node.values()), per_node
    assert "c" in recorder.messages


def test_a_cycle_decides_at_most_its_batch() -> None:
    cache = Cache()
    cache.set_node(node("n0", gpus=8))
    for i in range(5):
        cache.set_pod(pod(f"p{i}", gpus=1, created=i))
    recorder = Recorder()
    loop = runner(cache, recorder, Clock(), batch_decisions=2)
    loop.run_once()
    assert [name for name, _ in recorder.bound] == ["p0", "p1"]
    loop.run_once()
    assert [name for name, _ in recorder.bound] == ["p0", "p1", "p2", "p3"]


def test_a_failed_binding_backs_its_gang_off_instead_of_retrying_at_once() -> None:
    cache = Cache()
    cache.set_node(node("n0", gpus=8))
    cache.set_pod(pod("a", gpus=1))
    recorder = Recorder(fail={"a"})  # e.g. the API server answers 429
    clock = Clock()
    loop = runner(cache, recorder, clock, initial_backoff=1.0)
    loop.run_once()
    assert recorder.messages["a"].startswith("409")
    recorder.fail.clear()
    decision, next_at = loop.run_once()  # the same instant: the gang waits out its backoff
    assert decision is None
    assert next_at == clock.now + 1.0
    assert recorder.bound == []
    clock.now += 1.0
    loop.run_once()
    assert recorder.bound == [("a", "n0")]


def _torn_gang(cache: Cache, *, bound: int, min_member: int) -> None:
    for i in range(bound):
        cache.set_node(node(f"n{i}", gpus=8))
        cache.set_pod(
            pod(f"t{i}", gpus=8, gang="t", min_member=str(min_member), node=f"n{i}", created=i)
        )


def test_torn_gang_with_no_member_to_complete_it_is_told_then_asked_to_leave_after_the_grace() -> (
    None
):
    cache = Cache()
    _torn_gang(cache, bound=6, min_member=8)  # two members were deleted before they bound
    recorder = Recorder()
    clock = Clock()
    loop = runner(cache, recorder, clock, torn_grace=60.0, reclaim_grace=30.0)
    decision, next_at = loop.run_once()
    assert decision is None
    assert recorder.torn_seen == [("t", 6, clock.now + 60.0)]
    assert next_at == clock.now + 60.0  # the loop wakes for the release
    clock.now += 59
    loop.run_once()
    assert recorder.asked == []
    clock.now += 1
    _, next_at = loop.run_once()
    leave_by = clock.now + 30.0
    # Released through the notice path: asked to leave (leave-by), not evicted yet.
    assert recorder.released_seen == [("t", leave_by)]
    assert sorted(recorder.asked) == [(f"t{i}", leave_by, "ns/t") for i in range(6)]
    assert recorder.evicted == []
    assert next_at == leave_by
    clock.now += 29
    loop.run_once()
    assert recorder.evicted == []
    clock.now += 1
    loop.run_once()
    assert sorted(recorder.evicted) == [f"t{i}" for i in range(6)]
    clock.now += 60
    loop.run_once()
    assert len(recorder.torn_seen) == 1  # told once, not every cycle
    assert len(recorder.released_seen) == 1  # asked once


def test_torn_gang_completed_within_the_grace_is_not_released() -> None:
    cache = Cache()
    _torn_gang(cache, bound=2, min_member=3)
    cache.set_node(node("n9", gpus=8))
    recorder = Recorder()
    clock = Clock()
    loop = runner(cache, recorder, clock, torn_grace=60.0)
    loop.run_once()
    assert [t[0] for t in recorder.torn_seen] == ["t"]
    replacement = pod("t9", gpus=8, gang="t", min_member="3", created=9)
    cache.set_pod(replacement)
    clock.now += 10
    decision, _ = loop.run_once()
    assert decision is not None
    assert recorder.bound == [("t9", "n9")]
    cache.set_pod(replace(replacement, node=NodeName("n9")))  # the API server confirms it
    clock.now += 120
    loop.run_once()
    assert recorder.evicted == []
    assert recorder.released_seen == []


def test_a_finishing_gang_is_not_torn() -> None:
    cache = Cache()
    _torn_gang(cache, bound=2, min_member=3)
    done = pod("t9", gpus=8, gang="t", min_member="3", node="n0", created=9)
    cache.set_pod(replace(done, phase=PodPhase.SUCCEEDED))
    recorder = Recorder()
    clock = Clock()
    loop = runner(cache, recorder, clock, torn_grace=1.0)
    loop.run_once()
    clock.now += 10
    loop.run_once()
    assert recorder.torn_seen == []
    assert recorder.evicted == []


def test_a_raised_minimum_without_room_is_told_after_its_decision_then_asked_to_leave() -> None:
    cache = Cache()
    _torn_gang(cache, bound=2, min_member=3)  # min-member raised from 2 while they run
    for i in (8, 9):
        cache.set_pod(pod(f"t{i}", gpus=8, gang="t", min_member="3", created=i))
    recorder = Recorder()
    clock = Clock()
    loop = runner(cache, recorder, clock, torn_grace=60.0, reclaim_grace=30.0)
    decision, _ = loop.run_once()
    assert decision is not None
    assert decision.unschedulable is not None  # no room for the pending members
    assert recorder.torn_seen == [("t", 2, clock.now + 60.0)]
    clock.now += 60
    loop.run_once()
    assert recorder.released_seen == [("t", clock.now + 30.0)]
    assert sorted(a[0] for a in recorder.asked) == ["t0", "t1"]
    assert recorder.evicted == []  # the workers have until their leave-by


def test_a_release_leaves_a_member_already_asked_to_leave_for_another_gang_as_it_is() -> None:
    cache = Cache()
    _torn_gang(cache, bound=3, min_member=4)
    asked = cache.snapshot().pods[PodKey("ns/t0")]
    notes = {
        **asked.annotations,
        names.RECLAIMED_FOR_ANNOTATION: "ns/other",
        names.LEAVE_BY_ANNOTATION: "2030-01-01T00:00:00Z",
    }
    cache.set_pod(replace(asked, annotations=notes))
    recorder = Recorder()
    clock = Clock()
    loop = runner(cache, recorder, clock, torn_grace=10.0)
    loop.run_once()
    clock.now += 10
    loop.run_once()
    assert sorted(name for name, _, _ in recorder.asked) == ["t1", "t2"]


def test_a_torn_gang_waiting_for_room_asked_for_it_is_not_told() -> None:
    cache = Cache()
    _torn_gang(cache, bound=2, min_member=3)
    cache.set_pod(pod("t8", gpus=8, gang="t", min_member="3", created=8))
    cache.set_node(node("n8", gpus=8))
    notes = {
        names.RECLAIMED_FOR_ANNOTATION: "ns/t",
        names.LEAVE_BY_ANNOTATION: "2030-01-01T00:00:00Z",
    }
    cache.set_pod(pod("v", gpus=8, node="n8", annotations=notes))  # leaving to make room for t
    recorder = Recorder()
    clock = Clock()
    loop = runner(cache, recorder, clock, torn_grace=10.0)
    decision, _ = loop.run_once()
    assert decision is not None
    assert decision.unschedulable is not None
    cache.remove_pod(PodKey("ns/v"))
    clock.now += 5
    loop.run_once()
    assert recorder.bound == [("t8", "n8")]
    assert recorder.torn_seen == []


def test_minimum_and_maximum_raised_together_with_room_bind_without_a_warning() -> None:
    cache = Cache()
    _torn_gang(cache, bound=2, min_member=4)
    for i in (2, 3):
        cache.set_node(node(f"n{i}", gpus=8))
        cache.set_pod(pod(f"t{i}", gpus=8, gang="t", min_member="4", created=i))
    recorder = Recorder()
    clock = Clock()
    loop = runner(cache, recorder, clock, torn_grace=1.0)
    decision, _ = loop.run_once()
    assert decision is not None
    assert sorted(name for name, _ in recorder.bound) == ["t2", "t3"]
    clock.now += 10
    loop.run_once()
    assert recorder.torn_seen == []
    assert recorder.released_seen == []
    assert recorder.asked == []


def test_a_torn_gang_is_told_again_when_the_members_it_was_told_on_go() -> None:
    cache = Cache()
    _torn_gang(cache, bound=4, min_member=4)
    recorder = Recorder()
    clock = Clock()
    loop = runner(cache, recorder, clock, torn_grace=600.0)
    loop.run_once()
    assert recorder.torn_seen == []  # whole
    first = cache.snapshot().pods[PodKey("ns/t0")]
    cache.set_pod(replace(first, deleting=True))  # deleted, still in the cache
    loop.run_once()
    release_at = clock.now + 600.0
    assert recorder.torn_seen == [("t", 3, release_at)]
    cache.remove_pod(PodKey("ns/t0"))
    clock.now += 1
    loop.run_once()
    assert len(recorder.torn_seen) == 1  # the same survivors: nothing new to say
    cache.remove_pod(PodKey("ns/t1"))
    clock.now += 1
    loop.run_once()
    assert recorder.torn_seen[1:] == [("t", 2, release_at)]


def test_a_node_deleted_after_the_decision_gets_no_binding() -> None:
    cache = Cache()
    cache.set_node(node("n0", gpus=8))
    cache.set_pod(pod("a", gpus=8))
    recorder = Recorder()

    class DeleteFirst(Inline):
        def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
            cache.remove_node(NodeName("n0"))  # the node goes while the bind is queued
            return super().submit(fn, *args, **kwargs)

    loop = Runner(
        cache,
        recorder,
        recorder,
        Settings(scheduler_name=SCHED),
        clock=Clock(),
        executor=DeleteFirst(),
    )
    decision, _ = loop.run_once()
    assert decision is not None
    assert decision.bindings
    assert recorder.bound == []
    assert recorder.messages["a"] == "node n0 no longer exists"
    assert cache.assumed() == {}


def test_a_gang_whose_decision_raises_backs_off_alone_and_the_others_bind(
    monkeypatch: Any,
) -> None:
    from scheduler import cycle

    real = cycle.decide

    def decide(gang: Gang, *args: Any, **kwargs: Any) -> Any:
        if gang.name == "bad":
            raise ValueError("invalid literal for int()")
        return real(gang, *args, **kwargs)

    monkeypatch.setattr(cycle, "decide", decide)
    cache = Cache()
    cache.set_node(node("n0", gpus=8))
    cache.set_pod(pod("b0", gpus=1, gang="bad", created=1))
    cache.set_pod(pod("g0", gpus=1, gang="good", created=2))
    recorder = Recorder()
    loop = runner(cache, recorder, Clock())
    loop.run_once()
    assert recorder.bound == [("g0", "n0")]
    assert "could not decide for gang bad" in recorder.messages["b0"]
    assert "invalid literal" in recorder.messages["b0"]


def test_a_loop_whose_every_cycle_raises_is_reported_stalled(monkeypatch: Any) -> None:
    cache = Cache()
    loop = runner(cache, Recorder(), Clock())

    def broken() -> Any:
        raise RuntimeError("snapshot failed")

    stop = threading.Event()
    monkeypatch.setattr(cache, "snapshot", broken)
    loop.completed_at -= 100  # as if the loop had been running for a while
    thread = threading.Thread(target=loop.run, args=(stop,))
    thread.start()
    stop.wait(0.3)
    assert loop.stalled(60.0) is not None
    assert "no scheduling cycle has completed" in (loop.stalled(60.0) or "")
    monkeypatch.undo()
    loop.wake()
    deadline = 50
    while loop.stalled(60.0) is not None and deadline:
        stop.wait(0.1)
        deadline -= 1
    stop.set()
    loop.wake()
    thread.join(timeout=10)
    assert loop.stalled(60.0) is None  # cycles complete again: healthy


def test_a_pod_group_status_follows_its_pods_to_finished_and_then_stays() -> None:
    cache = Cache()
    cache.set_node(node("n1"))
    cache.set_pod_group(PodGroup("ns", "train", 3, uid="u1"))
    members = [pod(f"t{i}", pod_group="train") for i in range(3)]
    cache.set_pod(members[0])
    recorder, clock = Recorder(), Clock()
    loop = runner(cache, recorder, clock)

    def latest() -> GroupStatus:
        loop.run_once()
        return recorder.statuses["train"][-1]

    assert latest() == GroupStatus("Pending")
    for p in members[1:]:
        cache.set_pod(p)
    clock.now += 1
    started = clock.now
    assert latest() == GroupStatus("Scheduling", schedule_start=started)
    bound = {name: node_ for name, node_ in recorder.bound}
    assert len(bound) == 3
    clock.now += 1
    for p in members:
        cache.set_pod(replace(p, node=NodeName(bound[p.name]), phase=PodPhase.RUNNING))
    assert latest() == GroupStatus("Running", running=3, schedule_start=started)
    cache.set_pod(replace(members[0], node=NodeName("n1"), phase=PodPhase.SUCCEEDED))
    assert latest() == GroupStatus("Running", running=2, succeeded=1, schedule_start=started)
    for p in members[1:]:
        cache.set_pod(replace(p, node=NodeName("n1"), phase=PodPhase.SUCCEEDED))
    assert latest() == GroupStatus("Finished", succeeded=3, schedule_start=started)
    # The API server now shows the final phase: nothing is computed for the group again,
    # even when its pods go away.
    written = len(recorder.statuses["train"])
    cache.set_pod_group(PodGroup("ns", "train", 3, uid="u1", phase="Finished"))
    for p in members:
        cache.remove_pod(p.key)
    loop.run_once()
    assert len(recorder.statuses["train"]) == written


def test_a_pod_group_whose_pods_are_for_another_scheduler_gets_no_status() -> None:
    cache = Cache()
    cache.set_node(node("n1"))
    cache.set_pod_group(PodGroup("ns", "theirs", 1))
    cache.set_pod(pod("x0", pod_group="theirs", scheduler="default-scheduler"))
    recorder = Recorder()
    runner(cache, recorder, Clock()).run_once()
    assert recorder.statuses == {}
