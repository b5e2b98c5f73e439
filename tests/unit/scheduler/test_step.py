"""One step, two loops: the live loop (its I/O seam faked, on a virtual clock) and the simulator
fed the same events do the same things at the same moments — the same bindings, the same pods
asked to leave by the same leave-by, the same evictions, the same torn gangs told and released.
"""

from __future__ import annotations

import functools
import heapq
import itertools
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field, replace
from typing import ParamSpec, TypeVar

from scheduler.cache import Cache
from scheduler.cycle import Config
from scheduler.gang import GangBuilder
from scheduler.gang.group_status import GroupStatus
from scheduler.model import (
    Gang,
    GangKey,
    InvalidGang,
    Node,
    NodeName,
    PodGroup,
    PodRequest,
    Resources,
)
from scheduler.placement.shapes import ShapeLedger
from scheduler.runner import Runner, Settings
from scheduler.simulate import engine
from scheduler.simulate.inputs import JobSpec, SpotEvent
from scheduler.step import Ledgers, StepSettings, step
from tests.unit.scheduler.builders import GIB, SCHED, node, pod

P = ParamSpec("P")
T = TypeVar("T")

#: (time, effect, pod or gang, detail): what a loop did, as both record it.
Effect = tuple[float, str, str, str]


class Inline(Executor):
    """Runs work at submit time: the seam's writes happen at the moment they are decided."""

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:
            future.set_exception(exc)
        return future


@dataclass
class Seam:
    """The live loop's I/O, faked as the simulator models the cluster: a binding is confirmed at
    once, an evicted pod is recreated pending by its controller at once."""

    cache: Cache
    now: float = 0.0
    effects: list[Effect] = field(default_factory=list)
    woken: bool = False
    loop: Runner | None = None

    def clock(self) -> float:
        return self.now

    def _did(self, kind: str, name: str, detail: str = "") -> None:
        self.effects.append((self.now, kind, name, detail))

    # Binder
    def bind(self, pod: PodRequest, node: NodeName) -> str | None:
        self._did("bind", pod.name, node)
        self.cache.set_pod(replace(pod, node=node))
        return None

    def ask_to_leave(self, pod: PodRequest, leave_by: float, gang: GangKey) -> str | None:
        self._did("ask", pod.name, f"{leave_by:g}")
        return None

    def evict(self, pod: PodRequest) -> str | None:
        self._did("evict", pod.name)
        self.cache.set_pod(replace(pod, node=None))
        self.freed()
        return None

    def freed(self) -> None:
        assert self.loop is not None
        self.woken = True
        self.loop.wake(freed=True)

    # Reporter
    def torn(self, gang: Gang, release_at: float) -> None:
        self._did("torn", gang.name, f"{release_at:g}")

    def released(self, gang: Gang, since: float, leave_by: float) -> None:
        self._did("released", gang.name, f"{leave_by:g}")

    def unschedulable(
        self, gang: Gang, pods: Sequence[PodRequest], message: str, *, waiting: bool = False
    ) -> None: ...

    def scheduled(self, gang: Gang, pod: PodRequest, node: NodeName) -> None: ...

    def bind_failed(self, pod: PodRequest, node: NodeName, error: str) -> None: ...

    def asked_to_leave(
        self, pod: PodRequest, gang: Gang, leave_by: float, why: str = ""
    ) -> None: ...

    def nominated(self, pod: PodRequest, node: NodeName) -> None: ...

    def invalid(self, gang: InvalidGang) -> None: ...

    def group_status(self, group: PodGroup, status: GroupStatus) -> None: ...

    def gang_status(self, gang: Gang) -> None: ...


def members(job: JobSpec) -> list[PodRequest]:
    """The job's pods as the live loop sees them (labels and annotations make the gang), asking
    what the simulator's ask."""
    asks = Resources(1000 * job.pod_gpus, GIB * job.pod_gpus, job.pod_gpus, 1)
    return [
        replace(
            pod(
                f"{job.id}-{i}",
                namespace=engine.NAMESPACE,
                gpus=job.pod_gpus,
                gang=job.id,
                min_member=str(job.min_pods),
                max_member=str(job.max_pods),
                priority=job.priority,
                created=job.submit,
            ),
            requests=asks,
        )
        for i in range(job.max_pods)
    ]


class Live:
    """The live loop on a cluster that behaves as the simulator's: spot instances take the spot
    nodes in order, workers leave at the notice (or die at the removal), evicted pods come back
    pending at once."""

    def __init__(self, nodes: Sequence[Node], settings: engine.Settings, *, shapes: bool) -> None:
        self.cache = Cache()
        self.seam = Seam(self.cache)
        self.loop = Runner(
            self.cache,
            self.seam,
            self.seam,
            Settings(
                scheduler_name=SCHED,
                # As the program builds it (scheduler.app), --arrived-shapes on or off.
                config=Config(shapes=ShapeLedger() if shapes else None),
                reclaim_grace=settings.reclaim_grace,
                hold_extra=settings.hold_extra,
                torn_grace=settings.torn_grace,
                batch_seconds=float("inf"),
            ),
            clock=self.seam.clock,
            executor=Inline(),
        )
        self.seam.loop = self.loop
        self.settings = settings
        self.nodes = {n.name: n for n in nodes}
        self.slots = [n.name for n in nodes if n.spot]
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.order = iter(range(10**6))
        for n in nodes:
            if not n.spot:
                self.at(0.0, functools.partial(self.add, n.name))

    def at(self, when: float, event: Callable[[], None]) -> None:
        heapq.heappush(self.events, (when, next(self.order), event))

    def add(self, name: NodeName) -> None:
        self.cache.set_node(self.nodes[name])
        self.seam.freed()

    def leave(self, name: NodeName, *, remove: bool) -> None:
        for p in list(self.cache.snapshot().pods.values()):
            if p.node == name:
                self.cache.set_pod(replace(p, node=None))
        if remove:
            self.cache.remove_node(name)
        else:
            self.cache.set_node(replace(self.nodes[name], unschedulable=True))
        self.seam.freed()

    def arrive(self, job: JobSpec) -> None:
        for p in members(job):
            self.cache.set_pod(p)
        self.loop.wake()

    def plan(self, jobs: Sequence[JobSpec], spot: Sequence[SpotEvent]) -> None:
        held: dict[str, NodeName] = {}
        for e in spot:
            if e.kind == "add":
                held[e.node] = self.slots.pop(0)
                self.at(e.time, functools.partial(self.add, held[e.node]))
                continue
            target = held.pop(e.node)
            self.slots.append(target)
            if self.settings.checkpoint_on_notice:  # the workers leave at the notice
                notice = e.time - self.settings.notice_seconds
                self.at(notice, functools.partial(self.leave, target, remove=False))
            self.at(e.time, functools.partial(self.leave, target, remove=True))
        for job in jobs:
            self.at(job.submit, functools.partial(self.arrive, job))

    def run(self) -> list[Effect]:
        """As ``Runner.run`` drives it: a cycle after every event and again while something
        woke it, then sleep until the next event or the time the loop asks to be woken."""
        horizon = self.settings.horizon or 0.0
        next_at: float | None = 0.0
        while True:
            first = self.events[0][0] if self.events else None
            times = [t for t in (first, next_at) if t is not None]
            if not times or min(times) > horizon:
                return self.seam.effects
            self.seam.now = min(times)
            while self.events and self.events[0][0] == self.seam.now:
                heapq.heappop(self.events)[2]()
            busy = True
            while busy:
                self.seam.woken = False
                decision, next_at = self.loop.run_once()
                busy = decision is not None or self.seam.woken


def live(
    nodes: Sequence[Node],
    jobs: Sequence[JobSpec],
    spot: Sequence[SpotEvent],
    settings: engine.Settings,
    *,
    shapes: bool | None = None,
) -> list[Effect]:
    """The live loop's effects; counting the shapes that arrive (``--arrived-shapes``) as the
    simulator's settings say, unless ``shapes`` says otherwise."""
    cluster = Live(nodes, settings, shapes=settings.arrived_shapes if shapes is None else shapes)
    cluster.plan(jobs, spot)
    return cluster.run()


def simulated(
    nodes: Sequence[Node],
    jobs: Sequence[JobSpec],
    spot: Sequence[SpotEvent],
    settings: engine.Settings,
) -> list[Effect]:
    return engine.Simulation(nodes, jobs, spot, "shoal", settings).run().effects


#: n0 on demand; n1 and n2 spot instances from 0. n1's instance is revoked at 1000 (notice at
#: 880) and another one takes n1 at 1500.
NODES = [node("n0"), node("n1", spot=True), node("n2", spot=True)]
SPOT = [
    SpotEvent(0.0, "add", "i-1"),
    SpotEvent(0.0, "add", "i-2"),
    SpotEvent(1000.0, "remove", "i-1"),
    SpotEvent(1500.0, "add", "i-3"),
]
#: job-1: two 8-GPU members, both needed; job-2: one 4-GPU member needed, one more welcome;
#: job-3: one 4-GPU member, arriving when the cluster is full.
JOBS = [
    JobSpec("job-1", 0.0, 100000.0, pod_gpus=8, min_pods=2, max_pods=2),
    JobSpec("job-2", 0.0, 100000.0, pod_gpus=4, min_pods=1, max_pods=2),
    JobSpec("job-3", 50.0, 100000.0, pod_gpus=4, min_pods=1, max_pods=1),
]
SETTINGS = engine.Settings(
    notice_seconds=120.0,
    restart_seconds=0.0,
    reclaim_grace=30.0,
    hold_extra=120.0,
    torn_grace=60.0,
    record_effects=True,
    horizon=3000.0,
)


def test_the_live_loop_and_the_simulator_do_the_same_things_at_the_same_moments() -> None:
    # At 0 one step places job-1 and job-2 (with its surplus) in turn on one snapshot. At 50
    # job-3 does not fit: job-2's surplus member is asked to leave by 80, evicted then, and
    # job-3 takes its room. At the notice (880) job-1 loses its member on n1: torn, no room, it
    # is told it is released at 940; then its survivor is asked to leave by 970 and evicted,
    # and job-2 grows into the room. At 1500 n1 is back: job-2's surplus member is asked to
    # leave for job-1, which binds whole at 1530.
    simulator = simulated(NODES, JOBS, SPOT, SETTINGS)
    assert simulator == [
        (0.0, "bind", "job-1-0", "n0"),
        (0.0, "bind", "job-1-1", "n1"),
        (0.0, "bind", "job-2-0", "n2"),
        (0.0, "bind", "job-2-1", "n2"),
        (50.0, "ask", "job-2-1", "80"),
        (80.0, "evict", "job-2-1", ""),
        (80.0, "bind", "job-3-0", "n2"),
        (880.0, "torn", "job-1", "940"),
        (940.0, "released", "job-1", "970"),
        (940.0, "ask", "job-1-0", "970"),
        (970.0, "evict", "job-1-0", ""),
        (970.0, "bind", "job-2-1", "n0"),
        (1500.0, "ask", "job-2-1", "1530"),
        (1530.0, "evict", "job-2-1", ""),
        (1530.0, "bind", "job-1-0", "n0"),
        (1530.0, "bind", "job-1-1", "n1"),
    ]
    assert sorted(live(NODES, JOBS, SPOT, SETTINGS)) == sorted(simulator)


def test_without_notices_a_gang_torn_at_the_removal_is_released_alike_in_both() -> None:
    # The workers ignore the notice: job-1's member dies with n1 at 1000, and the same story
    # follows from there.
    settings = replace(SETTINGS, checkpoint_on_notice=False)
    simulator = simulated(NODES, JOBS, SPOT, settings)
    assert (1000.0, "torn", "job-1", "1060") in simulator
    assert (1090.0, "evict", "job-1-0", "") in simulator
    assert sorted(live(NODES, JOBS, SPOT, settings)) == sorted(simulator)


def test_a_batch_of_gangs_arriving_together_binds_alike_in_both() -> None:
    # Eight one-GPU gangs and a two-member gang at one instant, decided in turn on one
    # snapshot, fill the cluster; a gang arriving later finds no room in either.
    jobs = [
        JobSpec(f"small-{i}", 10.0, 5000.0, pod_gpus=1, min_pods=1, max_pods=1) for i in range(8)
    ]
    jobs.append(JobSpec("pair", 10.0, 5000.0, pod_gpus=8, min_pods=2, max_pods=2))
    jobs.append(JobSpec("late", 20.0, 5000.0, pod_gpus=8, min_pods=1, max_pods=1))
    settings = replace(SETTINGS, horizon=1000.0)
    simulator = simulated(NODES, jobs, SPOT[:2], settings)
    assert len([e for e in simulator if e[1] == "bind"]) == 10
    assert sorted(live(NODES, jobs, SPOT[:2], settings)) == sorted(simulator)


def test_a_step_stopped_early_leaves_the_gangs_it_did_not_hand_out_for_the_next_one() -> None:
    # The live loop stops taking outcomes when its time budget is spent: the gangs it did not
    # take were not decided (none backs off, none is told anything), and the next step decides
    # them: g1 is told it does not fit, g2 binds.
    cache = Cache()
    cache.set_node(node("n0", gpus=8))
    for i, gpus in enumerate((2, 16, 2)):
        cache.set_pod(pod(f"p{i}", gpus=gpus, gang=f"g{i}", created=float(i)))
    ledgers = Ledgers(StepSettings())

    def run_step(take: int) -> list[tuple[str, str]]:
        snap = cache.snapshot()
        gangs, _ = GangBuilder(SCHED).build(snap.pods.values(), snap.pod_groups, snap.members)
        outcomes = step(ledgers, gangs, snap, now=5.0).outcomes
        taken = list(itertools.islice(outcomes, take))
        outcomes.close()
        done: list[tuple[str, str]] = []
        for o in taken:
            for p, n in o.binds:
                cache.set_pod(replace(cache.snapshot().pods[p.key], node=n))
                done.append((o.decision.gang.name, f"bound on {n}"))
            if o.unplaced is not None:
                done.append((o.decision.gang.name, "told"))
        return done

    assert run_step(take=1) == [("g0", "bound on n0")]
    assert run_step(take=64) == [("g1", "told"), ("g2", "bound on n0")]


def test_the_live_loop_counts_the_shapes_that_arrive_as_the_simulator_does() -> None:
    # rack-a has 4 nodes, rack-b 8. A gang of three whole-node members fits both; rack-a is
    # the tighter, but would be left one node, too few for any gang that came (this one, of
    # 24 GPUs). Counting what arrives (the gang itself), the simulator sends it to rack-b,
    # which keeps five nodes, and so does the live loop, which holds its own ledger and hands
    # it to the same step; without one (--arrived-shapes=false), the live loop takes rack-a.
    nodes = [node(f"a{i}", rack="rack-a") for i in range(4)]
    nodes += [node(f"b{i}", rack="rack-b") for i in range(8)]
    jobs = [JobSpec("three", 0.0, 5000.0, pod_gpus=8, min_pods=3, max_pods=3)]
    settings = replace(SETTINGS, horizon=100.0)

    def racks(effects: list[Effect]) -> set[str]:
        return {where[0] for _, kind, _, where in effects if kind == "bind"}

    simulator = simulated(nodes, jobs, [], settings)
    assert len(simulator) == 3
    assert racks(simulator) == {"b"}
    assert sorted(live(nodes, jobs, [], settings)) == sorted(simulator)
    assert racks(live(nodes, jobs, [], settings, shapes=False)) == {"a"}
    # The simulator without the count (--no-arrived-shapes) places as that live loop does.
    unaware = replace(settings, arrived_shapes=False)
    assert sorted(simulated(nodes, jobs, [], unaware)) == sorted(live(nodes, jobs, [], unaware))
