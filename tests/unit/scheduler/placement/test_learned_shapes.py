"""The pod shapes that arrived (``ShapeLedger``) in what a placement costs, on plain values."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest

from contracts import names
from scheduler.gang import build_gangs
from scheduler.model import (
    Gang,
    GangKey,
    NodeName,
    NodeState,
    Placement,
    PodRequest,
    Resources,
    Unschedulable,
)
from scheduler.placement import Request, demand, place
from scheduler.placement.shapes import Likely, ShapeLedger
from tests.unit.scheduler.builders import GIB, SCHED, node, pod, snapshot

KEYS = names.DEFAULT_TOPOLOGY_KEYS


def sized(name: str, *, gpus: int, cpu: int, memory_gib: int, **kw: Any) -> PodRequest:
    made = pod(name, gpus=gpus, **kw)
    return replace(made, requests=Resources(cpu * 1000, memory_gib * GIB, gpus, 1))


def request(pods: Sequence[PodRequest], **kw: Any) -> Request:
    return Request(gang=GangKey("ns/g"), pods=pods, topology_keys=KEYS, **kw)


def where(result: Placement | Unschedulable) -> dict[str, str]:
    assert isinstance(result, Placement), result
    return {a.pod.split("/")[1]: a.node for a in result.assignments}


def seen(*pods: tuple[Resources, int]) -> Likely:
    """A ledger's view after the lone pods ``pods`` (requests, how many) arrived at time 0."""
    ledger = ShapeLedger()
    for requests, count in pods:
        for _ in range(count):
            ledger.observe([requests], now=0.0)
    return ledger.likely()


def test_a_cpu_only_pod_leaves_the_cpu_the_arriving_gpu_pods_need_beside_a_free_gpu() -> None:
    # Two 8-GPU nodes of 96 CPUs with one GPU free each: a has 20 CPUs free beside it, b 14.
    # A CPU-only pod asking 4 CPUs fits both. Read from the node shapes alone, a GPU's share is
    # 12 CPUs, which a keeps after the pod and b does not, so the pod goes to a, and the 1-GPU
    # pod asking 18 CPUs that comes next fits nowhere: CPU stranded beside a free GPU. Told
    # that such pods arrive, the placement sends the CPU-only pod to b, and the 1-GPU pod fits.
    nodes = [node("a", cpu=96, memory_gib=384), node("b", cpu=96, memory_gib=384)]
    busy = [
        sized("busy-a", gpus=7, cpu=76, memory_gib=200, node="a"),
        sized("busy-b", gpus=7, cpu=82, memory_gib=200, node="b"),
    ]
    cpu_pod = sized("cpu", gpus=0, cpu=4, memory_gib=8)
    gpu_pod = sized("gpu", gpus=1, cpu=18, memory_gib=60)
    likely = seen((gpu_pod.requests, 40), (Resources(4000, 16 * GIB, 1, 1), 40))

    def after_cpu_pod(told: Likely) -> tuple[str, Placement | Unschedulable]:
        first = where(place(request([cpu_pod], likely=told), snapshot(nodes, busy).nodes))["cpu"]
        bound = [*busy, replace(cpu_pod, node=NodeName(first))]
        return first, place(request([gpu_pod], likely=told), snapshot(nodes, bound).nodes)

    first, then = after_cpu_pod(Likely())
    assert first == "a"
    assert isinstance(then, Unschedulable)
    first, then = after_cpu_pod(likely)
    assert first == "b"
    assert where(then) == {"gpu": "a"}


def test_arrivals_count_less_as_they_age() -> None:
    # Ten pods of one shape at time 0, ten of another two half-lives later: the newer weigh
    # four times the older. The shares sum to 1, the most frequent first.
    old, new = Resources(4000, 16 * GIB, 1, 1), Resources(16000, 64 * GIB, 2, 1)
    ledger = ShapeLedger(half_life=600.0)
    for _ in range(10):
        ledger.observe([old], now=0.0)
    for _ in range(10):
        ledger.observe([new], now=1200.0)
    shapes = ledger.likely().shapes
    assert [shape for shape, _ in shapes] == [(16000, 64 * GIB, 2), (4000, 16 * GIB, 1)]
    assert [share for _, share in shapes] == pytest.approx([0.8, 0.2])


def test_only_the_most_frequent_gpu_shapes_are_handed_over() -> None:
    # Each shape handed over is one more thing the placement tracks on every node: the ledger
    # hands over its `limit` most frequent GPU shapes; CPU-only pods add none.
    ledger = ShapeLedger(limit=3)
    for cpu in range(1, 7):
        for _ in range(cpu):
            ledger.observe(
                [Resources(cpu * 1000, GIB, 1, 1), Resources(cpu * 1000, GIB, 0, 1)], 0.0
            )
    likely = ledger.likely()
    assert [shape[0] for shape, _ in likely.shapes] == [6000, 5000, 4000]
    assert sum(share for _, share in likely.shapes) == pytest.approx(1.0)
    # Gangs are counted by the GPUs they ask in all.
    assert [size for size, _ in likely.gangs] == [1]


def test_a_gang_leaves_no_rack_too_broken_for_the_gangs_that_come() -> None:
    # rack-a has 4 free nodes, rack-b 8 (one node shape). A gang of two fits rack-a tighter,
    # leaving it 2 nodes, too few for the gangs of three that come; in rack-b it leaves 6,
    # room for two of them. Told of the gangs that come, it goes to rack-b, and afterwards
    # three gangs of three fit (without it, two).
    nodes = [node(f"a{i}", rack="rack-a", cpu=96, memory_gib=384) for i in range(8)]
    nodes += [node(f"b{i}", rack="rack-b", cpu=96, memory_gib=384) for i in range(8)]
    full = [sized(f"u{i}", gpus=8, cpu=64, memory_gib=256, node=f"a{i}") for i in range(4)]
    member = Resources(64_000, 256 * GIB, 8, 1)
    ledger = ShapeLedger()
    for _ in range(5):
        ledger.observe([member] * 3, now=0.0)

    def fitted(told: Likely) -> int:
        bound = list(full)
        two = [sized(f"t{i}", gpus=8, cpu=64, memory_gib=256, gang="two") for i in range(2)]
        placed = where(
            place(
                request(two, required=names.RACK_LABEL, likely=told), snapshot(nodes, bound).nodes
            )
        )
        bound += [replace(p, node=NodeName(placed[p.name])) for p in two]
        count = 0
        for g in range(4):
            gang = [
                sized(f"g{g}{i}", gpus=8, cpu=64, memory_gib=256, gang=f"g{g}") for i in range(3)
            ]
            result = place(
                request(gang, required=names.RACK_LABEL, likely=told),
                snapshot(nodes, bound).nodes,
            )
            if isinstance(result, Placement):
                count += 1
                fit = where(result)
                bound += [replace(p, node=NodeName(fit[p.name])) for p in gang]
        return count

    assert fitted(Likely()) == 2
    assert fitted(ledger.likely()) == 3


def test_learned_shapes_hosts_are_counted_as_filtering_every_node_would() -> None:
    # The hosts of the learned shapes are kept between calls like the node shapes' ones.
    def fresh(nodes: Mapping[NodeName, NodeState]) -> list[int]:
        return [
            sum(
                s.free.gpu >= g and s.free.cpu_milli >= c and s.free.memory >= m and s.free.gpu > 0
                for s in nodes.values()
            )
            for c, m, g in demand.demand_of(nodes, learned=likely).shapes
        ]

    nodes = [node(f"n{i}", cpu=96, memory_gib=384) for i in range(4)]
    likely = seen((Resources(18_000, 60 * GIB, 1, 1), 3), (Resources(40_000, 100 * GIB, 2, 1), 1))
    bound: list[PodRequest] = []
    for i in range(6):
        snap = snapshot(nodes, bound)
        learned = demand.demand_of(snap.nodes, learned=likely)
        assert (18_000, 60 * GIB, 1) in learned.shapes
        assert learned.hosts == fresh(snap.nodes)
        bound.append(sized(f"s{i}", gpus=1, cpu=30, memory_gib=100, node=f"n{i % 4}"))


def test_the_gangs_a_step_sees_are_counted_once_each_as_they_arrive() -> None:
    # What the live loop and the simulator hand the ledger in every step: the gangs built from
    # the snapshot. A pod that waits through many steps counts once; a gang counts once, by the
    # GPUs of its minimum, when every member of it exists; a pod gone and a new one of the
    # same shape counts again.
    def gangs(pods: Sequence[PodRequest]) -> list[Gang]:
        built, invalid = build_gangs(pods, {}, SCHED)
        assert invalid == []
        return built

    big = [sized("big-0", gpus=8, cpu=64, memory_gib=256, gang="big", min_member="3")]
    lone = sized("lone", gpus=1, cpu=18, memory_gib=60)
    ledger = ShapeLedger()
    for _ in range(3):  # three steps: the lone pod and one member of "big" wait
        ledger.arrived(gangs([lone, *big[:1]]), 0.0)
    assert ledger.likely().shapes == (
        ((18_000, 60 * GIB, 1), 0.5),
        ((64_000, 256 * GIB, 8), 0.5),
    )
    assert ledger.likely().gangs == ((1, 1.0),)  # "big" lacks two members of its minimum
    big += [
        sized(f"big-{i}", gpus=8, cpu=64, memory_gib=256, gang="big", min_member="3")
        for i in (1, 2)
    ]
    ledger.arrived(gangs([lone, *big]), 0.0)
    ledger.arrived(gangs([replace(lone, node=NodeName("n0")), *big]), 0.0)  # bound: no news
    assert dict(ledger.likely().shapes)[(64_000, 256 * GIB, 8)] == pytest.approx(0.75)
    assert ledger.likely().gangs == ((1, 0.5), (24, 0.5))
    ledger.arrived(gangs(big), 0.0)  # the lone pod finished ...
    again = replace(lone, uid="uid-lone-2")
    ledger.arrived(gangs([again, *big]), 0.0)  # ... and one like it came: a second arrival
    assert dict(ledger.likely().shapes)[(18_000, 60 * GIB, 1)] == pytest.approx(0.4)
