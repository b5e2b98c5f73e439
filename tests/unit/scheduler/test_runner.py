"""The scheduling loop with recording implementations of its two seams and a virtual clock:
assume before bind, forget on failure, reclaim notice then eviction at the deadline."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field, replace
from typing import Any, ParamSpec, TypeVar

from contracts import names
from scheduler.cache import Cache
from scheduler.model import Gang, GangKey, InvalidGang, NodeName, PodKey, PodRequest
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
    def unschedulable(self, gang: Gang, pods: Sequence[PodRequest], message: str) -> None:
        self.messages[gang.name] = message
        for p in pods:
            self.messages[p.name] = message

    def scheduled(self, gang: Gang, pod: PodRequest, node: NodeName) -> None:
        pass

    def bind_failed(self, pod: PodRequest, node: NodeName, error: str) -> None:
        self.messages[pod.name] = error

    def asked_to_leave(self, pod: PodRequest, gang: Gang, leave_by: float) -> None:
        pass

    def nominated(self, pod: PodRequest, node: NodeName) -> None:
        self.nominations[pod.name] = node

    def invalid(self, gang: InvalidGang) -> None:
        self.invalid_seen.append(gang.message)

    def gang_status(self, gang: Gang) -> None:
        pass


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
