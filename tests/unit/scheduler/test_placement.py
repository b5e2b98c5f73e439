"""Filters, scores and the gang placement search, on plain values."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from contracts import names
from scheduler import cycle
from scheduler.gang import build_gangs
from scheduler.model import (
    GangKey,
    Node,
    NodeName,
    Placement,
    PodRequest,
    Resources,
    SelectorRequirement,
    SelectorTerm,
    Taint,
    Toleration,
    Unschedulable,
)
from scheduler.placement import Request, demand, filters, place
from scheduler.queue import GangQueue
from tests.unit.scheduler.builders import GIB, node, pod, snapshot

KEYS = names.DEFAULT_TOPOLOGY_KEYS
KWOK = Taint(names.KWOK_TAINT, "fake", "NoSchedule")
TOLERATE_KWOK = Toleration(names.KWOK_TAINT, "Equal", "fake", "NoSchedule")


def request(pods: Sequence[PodRequest], **kw: Any) -> Request:
    return Request(gang=GangKey("ns/g"), pods=pods, topology_keys=KEYS, **kw)


def placed(result: Placement | Unschedulable) -> dict[str, str]:
    assert isinstance(result, Placement), result
    return {a.pod.split("/")[1]: a.node for a in result.assignments}


def test_filters_explain_each_refusal_like_kube_scheduler() -> None:
    nodes = [
        node("cordoned", unschedulable=True),
        node("revoking", taints=(Taint(names.REVOKING_TAINT, "aws", "NoSchedule"),)),
        node("tainted", taints=(KWOK,)),
        node("small", gpus=1),
        node("other", labels={"pool": "b"}),
    ]
    snap = snapshot(nodes)
    p = pod("p", gpus=2)
    reasons = {n: filters.first_failure(p, snap.nodes[NodeName(n)]) for n in snap.nodes}
    assert reasons == {
        "cordoned": filters.UNSCHEDULABLE,
        "revoking": filters.REVOKING,
        "tainted": "node(s) had untolerated taint {kwok.x-k8s.io/node: fake}",
        "small": filters.INSUFFICIENT_GPU,
        "other": None,
    }


def test_revoking_taint_refuses_even_pods_that_tolerate_everything() -> None:
    state = snapshot([node("n", taints=(Taint(names.REVOKING_TAINT, "gcp"),))]).nodes
    anything = pod("p", tolerations=(Toleration(operator="Exists"),))
    assert filters.first_failure(anything, state[NodeName("n")]) == filters.REVOKING


def test_toleration_and_selector_and_affinity_admit_the_right_nodes() -> None:
    nodes = snapshot([node("a", taints=(KWOK,), labels={"pool": "a"}), node("b")]).nodes
    p = pod("p", tolerations=(TOLERATE_KWOK,), node_selector={"pool": "a"})
    assert filters.first_failure(p, nodes[NodeName("a")]) is None
    assert filters.first_failure(p, nodes[NodeName("b")]) == filters.SELECTOR
    term = SelectorTerm((SelectorRequirement("pool", "NotIn", ("a",)),))
    q = replace(pod("q", tolerations=(TOLERATE_KWOK,)), affinity=(term,))
    assert filters.first_failure(q, nodes[NodeName("a")]) == filters.SELECTOR
    assert filters.first_failure(q, nodes[NodeName("b")]) is None


def test_unschedulable_message_counts_nodes_per_reason() -> None:
    nodes = [node(f"full{i}", gpus=2) for i in range(3)] + [node("cordoned", unschedulable=True)]
    result = place(request([pod("p", gpus=4)]), snapshot(nodes).nodes)
    assert isinstance(result, Unschedulable)
    assert result.message() == (
        "0/4 nodes are available: 3 Insufficient nvidia.com/gpu, 1 node(s) were unschedulable."
    )


def test_gang_that_fits_one_rack_lands_in_one_rack() -> None:
    # rack-a: 4 nodes with 4 free GPUs each. rack-b: 3 nodes of 4 GPUs — tighter fits one by one,
    # but too small for 4 x 4 GPUs; a per-pod greedy would put three members there.
    nodes = [node(f"a{i}", rack="rack-a") for i in range(4)]
    nodes += [node(f"b{i}", rack="rack-b", gpus=4) for i in range(3)]
    busy = [pod(f"busy-a{i}", gpus=4, node=f"a{i}") for i in range(4)]
    gang = [pod(f"w{i}", gpus=4, gang="g") for i in range(4)]
    result = place(request(gang), snapshot(nodes, busy).nodes)
    assert isinstance(result, Placement)
    assert result.domains[names.RACK_LABEL] == 1
    assert set(placed(result).values()) <= {f"a{i}" for i in range(4)}


def test_gang_too_big_for_one_rack_still_spreads_without_requirement() -> None:
    nodes = [node("a0", rack="rack-a"), node("b0", rack="rack-b")]
    gang = [pod(f"w{i}", gpus=8, gang="g") for i in range(2)]
    assert sorted(placed(place(request(gang), snapshot(nodes).nodes)).values()) == ["a0", "b0"]


def test_topology_required_waits_rather_than_spread() -> None:
    nodes = [node("a0", rack="rack-a"), node("b0", rack="rack-b")]
    gang = [pod(f"w{i}", gpus=8, gang="g") for i in range(2)]
    result = place(request(gang, required=names.RACK_LABEL), snapshot(nodes).nodes)
    assert isinstance(result, Unschedulable)
    assert "no single shoal.dev/rack has room for all 2 member(s)" in result.message()
    # Per node, as for one pod: the closest rack is short of GPUs, the other is another rack.
    assert result.reasons == {
        "Insufficient nvidia.com/gpu": 1,
        "node(s) in another shoal.dev/rack than the gang's closest fit": 1,
    }


def test_unknown_required_topology_key_is_explained() -> None:
    result = place(
        request([pod("w")], required="example.com/pod-rack"), snapshot([node("a")]).nodes
    )
    assert isinstance(result, Unschedulable)
    assert "'example.com/pod-rack'" in result.message()
    assert "not a label of any node" in result.message()


def test_four_gpu_pod_prefers_a_whole_free_island_over_scattered_gpus() -> None:
    # "scattered": 8 GPUs in islands of 4 with two GPUs taken in each island (4 free, 2+2).
    # "island": islands of 4 with one whole island taken (4 free, 0+4). Tight fit is a tie.
    scattered = node("scattered", island_size=4, allocated={0: "x/a", 1: "x/a", 4: "x/b", 5: "x/b"})
    island = node("whole", island_size=4, allocated={0: "x/c", 1: "x/c", 2: "x/c", 3: "x/c"})
    result = place(request([pod("w", gpus=4)]), snapshot([scattered, island]).nodes)
    assert placed(result) == {"w": "whole"}


def test_island_beats_tight_fit() -> None:
    # A 4-GPU node made of two NVLink pairs is a tighter fit, but the pod would straddle pairs.
    pairs = node("pairs", gpus=4, island_size=2)
    big = node("big", gpus=8, island_size=4)
    assert placed(place(request([pod("w", gpus=4)]), snapshot([pairs, big]).nodes)) == {"w": "big"}


def test_tight_fit_keeps_whole_nodes_free() -> None:
    nodes = [node("empty"), node("half")]
    busy = [pod("busy", gpus=4, node="half")]
    assert placed(place(request([pod("w", gpus=2)]), snapshot(nodes, busy).nodes)) == {"w": "half"}


def test_minimum_prefers_on_demand_and_surplus_prefers_spot() -> None:
    nodes = snapshot([node("od"), node("spot", spot=True)]).nodes
    assert placed(place(request([pod("m", gpus=8)]), nodes)) == {"m": "od"}
    assert placed(place(request([pod("s", gpus=8)], surplus=True), nodes)) == {"s": "spot"}


def test_unannotated_pods_already_on_a_node_use_up_its_islands() -> None:
    # Two 2-GPU pods the node agent has not reported yet fill one island of 4.
    nodes = [node("n", island_size=4)]
    busy = [pod("b1", gpus=2, node="n"), pod("b2", gpus=2, node="n")]
    state = snapshot(nodes, busy).nodes[NodeName("n")]
    assert state.islands == (0, 4)


Cluster = tuple[list[Node], list[PodRequest], list[PodRequest]]


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    count = draw(st.integers(1, 6))
    nodes = [
        node(
            f"n{i}",
            gpus=draw(st.sampled_from([0, 2, 4, 8])),
            cpu=draw(st.integers(1, 16)),
            rack=f"r{draw(st.integers(0, 2))}",
            spot=draw(st.booleans()),
            island_size=draw(st.sampled_from([None, 1, 2, 4])),
        )
        for i in range(count)
    ]
    busy: list[PodRequest] = []
    for i in range(draw(st.integers(0, 4))):
        target = draw(st.sampled_from(nodes))
        busy.append(pod(f"busy{i}", gpus=draw(st.integers(0, 2)), node=target.name, cpu_milli=500))
    gang = [
        pod(f"w{i}", gpus=draw(st.integers(0, 4)), cpu_milli=draw(st.integers(0, 8000)))
        for i in range(draw(st.integers(1, 6)))
    ]
    return nodes, busy, gang


@settings(max_examples=300, deadline=None)
@given(clusters(), st.sampled_from([None, names.RACK_LABEL]), st.booleans())
def test_placement_never_overcommits_and_is_all_or_nothing(
    cluster: Cluster, required: str | None, surplus: bool
) -> None:
    nodes, busy, gang = cluster
    snap = snapshot(nodes, busy)
    result = place(request(gang, required=required, surplus=surplus), snap.nodes)
    if isinstance(result, Unschedulable):
        assert result.message()
        return
    # Every member is placed exactly once ...
    assert sorted(a.pod for a in result.assignments) == sorted(p.key for p in gang)
    # ... and no node gives more than it has free.
    asked: Counter[str] = Counter()
    cpu: Counter[str] = Counter()
    by_key = {p.key: p for p in gang}
    for a in result.assignments:
        asked[a.node] += by_key[a.pod].requests.gpu
        cpu[a.node] += by_key[a.pod].requests.cpu_milli
    for name, gpus in asked.items():
        free = snap.nodes[NodeName(name)].free
        assert gpus <= free.gpu
        assert cpu[name] <= free.cpu_milli
    if required:
        assert result.domains.get(required, 0) <= 1


def test_topology_preferred_label_is_tried_first() -> None:
    # "example.com/pod" is not a configured key. A rack-first search puts the two members in
    # rack-y, which straddles pod-a and pod-b; preferring the pod label keeps them in one pod.
    nodes = [
        node("a0", rack="rack-x", labels={"example.com/pod": "pod-a"}),
        node("a1", rack="rack-y", labels={"example.com/pod": "pod-a"}),
        node("b0", rack="rack-y", labels={"example.com/pod": "pod-b"}),
        node("b1", rack="rack-z", labels={"example.com/pod": "pod-b"}),
    ]
    gang = [pod(f"w{i}", gpus=8, gang="g") for i in range(2)]
    result = place(request(gang, preferred="example.com/pod"), snapshot(nodes).nodes)
    assert isinstance(result, Placement)
    assert result.domains["example.com/pod"] == 1


def test_a_cpu_only_pod_uses_cpu_beside_busy_gpus_not_the_cpu_free_gpus_need() -> None:
    # Node "a-idle" sorts first by name and has every GPU free; "b-busy" has all 8 GPUs taken
    # by 1-GPU pods of 2 CPUs each, so 16 of its 32 CPUs are idle.
    busy = [
        pod(f"w{i}", gpus=1, cpu_milli=2000, node="b-busy", namespace="other") for i in range(8)
    ]
    nodes = [node("a-idle", cpu=32), node("b-busy", cpu=32)]
    snap = snapshot(nodes, busy)
    batch = pod("batch", gpus=0, cpu_milli=12_000)
    assert placed(place(request([batch]), snap.nodes)) == {"batch": "b-busy"}
    # So an 8-GPU pod that needs 24 CPUs still finds a home afterwards.
    snap = snapshot(nodes, [*busy, replace(batch, node=NodeName("b-busy"))])
    trainer = pod("trainer", gpus=8, cpu_milli=24_000)
    assert placed(place(request([trainer]), snap.nodes)) == {"trainer": "a-idle"}


def test_equal_nodes_are_not_chosen_by_name_order() -> None:
    nodes = [node(f"n{i:02d}", gpus=8) for i in range(12)]
    snap = snapshot(nodes)
    chosen = {
        placed(place(request([pod(f"p{i}", gpus=8)]), snap.nodes))[f"p{i}"] for i in range(12)
    }
    # Twelve different pods each alone on twelve equal nodes: by name, every one would take n00.
    assert len(chosen) > 1


def test_members_that_each_fit_but_not_together_get_per_node_reasons() -> None:
    snap = snapshot([node("a", gpus=8), node("b", gpus=8), node("c", gpus=8)])
    pods = [pod(f"m{i}", gpus=8, gang="g") for i in range(4)]
    result = place(request(pods), snap.nodes)
    assert isinstance(result, Unschedulable)
    assert result.message() == (
        "only 3 of the 4 member(s) fit at once; 0/3 nodes are available: "
        "3 Insufficient nvidia.com/gpu."
    )


def test_a_member_that_fits_only_some_nodes_names_why_the_others_refuse_it() -> None:
    snap = snapshot([node("a", gpus=8), node("b", gpus=8)])
    pods = [
        pod(f"m{i}", gpus=8, gang="g", node_selector={"kubernetes.io/hostname": "a"})
        for i in range(2)
    ]
    result = place(request(pods), snap.nodes)
    assert isinstance(result, Unschedulable)
    assert result.message() == (
        "only 1 of the 2 member(s) fit at once; 0/2 nodes are available: "
        f"1 Insufficient nvidia.com/gpu, 1 {filters.SELECTOR}."
    )


def sized(name: str, *, gpus: int, cpu: int, memory_gib: int, **kw: Any) -> PodRequest:
    made = pod(name, gpus=gpus, **kw)
    return replace(made, requests=Resources(cpu * 1000, memory_gib * GIB, gpus, 1))


def test_a_small_pod_keeps_off_the_scarce_node_that_alone_fits_the_biggest_pods() -> None:
    # Three plentiful 8-GPU nodes of 96 CPUs and 384 GiB, one scarce one of 128 CPUs and 768
    # GiB: the only home of an 8-GPU pod asking 120 CPUs. A 1-GPU pod asking 18 CPUs and 63 GiB
    # strands less CPU per GPU on the scarce node, but it goes to a plentiful one, every time.
    nodes = [node(f"std{i}", cpu=96, memory_gib=384) for i in range(3)]
    nodes.append(node("big", cpu=128, memory_gib=768))
    snap = snapshot(nodes)
    for i in range(8):
        small = sized(f"small{i}", gpus=1, cpu=18, memory_gib=63)
        assert placed(place(request([small]), snap.nodes))[f"small{i}"].startswith("std")
    # And the biggest pod still finds its node once the small ones are placed.
    pods = [
        replace(sized(f"s{i}", gpus=1, cpu=18, memory_gib=63), node=NodeName(f"std{i % 3}"))
        for i in range(9)
    ]
    biggest = sized("biggest", gpus=8, cpu=120, memory_gib=720)
    assert placed(place(request([biggest]), snapshot(nodes, pods).nodes)) == {"biggest": "big"}


def test_a_gang_leaves_the_only_rack_a_bigger_gang_could_use() -> None:
    # rack-a: 4 nodes of 128 CPUs and 768 GiB; rack-b: 6 of 96 CPUs and 384 GiB. A gang of four
    # 8-GPU members asking 64 CPUs fits both racks, and rack-a is the tighter fit (no GPU left
    # over); it goes to rack-b, so that a gang of four members asking 120 CPUs each, which only
    # rack-a can hold, still fits.
    nodes = [node(f"a{i}", rack="rack-a", cpu=128, memory_gib=768) for i in range(4)]
    nodes += [node(f"b{i}", rack="rack-b", cpu=96, memory_gib=384) for i in range(6)]
    first = [sized(f"f{i}", gpus=8, cpu=64, memory_gib=256, gang="first") for i in range(4)]
    result = place(request(first, required=names.RACK_LABEL), snapshot(nodes).nodes)
    assert set(placed(result).values()) <= {f"b{i}" for i in range(6)}
    where = placed(result)
    bound = [replace(p, node=NodeName(where[p.name])) for p in first]
    bigger = [sized(f"g{i}", gpus=8, cpu=120, memory_gib=720, gang="bigger") for i in range(4)]
    result = place(request(bigger, required=names.RACK_LABEL), snapshot(nodes, bound).nodes)
    assert set(placed(result).values()) == {f"a{i}" for i in range(4)}


def test_the_likely_pods_hosts_are_counted_as_filtering_every_node_would() -> None:
    # The counts are kept between calls per node state; after changes, and after a switch to
    # another cluster and back, they equal a count made from scratch.
    def fresh(snap_nodes: Any) -> list[int]:
        shapes = demand.demand_of(snap_nodes).shapes
        return [
            sum(
                s.free.gpu >= g and s.free.cpu_milli >= c and s.free.memory >= m and s.free.gpu > 0
                for s in snap_nodes.values()
            )
            for c, m, g in shapes
        ]

    nodes = [node(f"std{i}", cpu=96, memory_gib=384) for i in range(3)]
    nodes.append(node("big", cpu=128, memory_gib=768))
    other = [node("x", gpus=4, cpu=32, memory_gib=128)]
    bound: list[PodRequest] = []
    for i in range(6):
        snap = snapshot(nodes, bound)
        assert demand.demand_of(snap.nodes).hosts == fresh(snap.nodes)
        assert demand.demand_of(snapshot(other).nodes).hosts == fresh(snapshot(other).nodes)
        bound.append(sized(f"s{i}", gpus=2, cpu=30, memory_gib=100, node=f"std{i % 3}"))


def test_equal_scores_go_to_the_most_plentiful_node_shape_not_a_hash() -> None:
    # CPU-only nodes of two shapes, and pods asking nothing that tells them apart: every score
    # term is equal, and the three nodes of the common shape take every pod.
    nodes = [node(f"common{i}", gpus=0, cpu=32) for i in range(3)]
    nodes.append(node("rare", gpus=0, cpu=64))
    snap = snapshot(nodes)
    chosen = {
        placed(place(request([sized(f"p{i}", gpus=0, cpu=0, memory_gib=0)]), snap.nodes))[f"p{i}"]
        for i in range(12)
    }
    assert chosen <= {"common0", "common1", "common2"}


def test_a_gang_fills_a_rack_exactly_rather_than_break_a_whole_one() -> None:
    # rack-a: 4 nodes of 128 CPUs (the scarce shape); rack-b: 8 of 96 CPUs. A gang of four
    # members asking 64 CPUs fits rack-a exactly; in rack-b it would leave 4 nodes, too few for
    # a gang of eight. Taking the whole scarce rack costs the likely pods less than breaking
    # rack-b costs, so it goes to rack-a, and a gang of eight still fits rack-b.
    nodes = [node(f"a{i}", rack="rack-a", cpu=128, memory_gib=768) for i in range(4)]
    nodes += [node(f"b{i}", rack="rack-b", cpu=96, memory_gib=384) for i in range(8)]
    first = [sized(f"f{i}", gpus=8, cpu=64, memory_gib=256, gang="first") for i in range(4)]
    where = placed(place(request(first, required=names.RACK_LABEL), snapshot(nodes).nodes))
    assert set(where.values()) == {f"a{i}" for i in range(4)}
    bound = [replace(p, node=NodeName(where[p.name])) for p in first]
    eight = [sized(f"e{i}", gpus=8, cpu=64, memory_gib=256, gang="eight") for i in range(8)]
    result = place(request(eight, required=names.RACK_LABEL), snapshot(nodes, bound).nodes)
    assert set(placed(result).values()) == {f"b{i}" for i in range(8)}


def test_taking_the_last_hosts_of_a_shape_costs_more_for_each_member() -> None:
    # One member after another pays against the hosts the members before it left: the four
    # hosts of a shape cost 1/4 + 1/3 + 1/2 + 1 of it, not four times 1/4.
    nodes = [node(f"a{i}", cpu=128, memory_gib=768) for i in range(4)]
    nodes += [node(f"b{i}", cpu=96, memory_gib=384) for i in range(8)]
    likely = demand.demand_of(snapshot(nodes).nodes)
    scarce = likely.shapes.index((128_000, 768 * GIB, 8))
    whole = Resources(128_000, 768 * GIB, 8, 1)
    free = Resources(128_000, 768 * GIB, 8, 110)
    taken: dict[int, int] = {}
    charges = [likely.charge(1 << scarce, taken) for _ in range(4)]
    assert charges == sorted(charges)
    assert charges[0] == likely.cost(whole, free) - sum(
        likely.loss(bit)
        for bit in range(len(likely.shapes))
        if bit != scarce and likely.lost(whole, free) >> bit & 1
    )
    assert charges[-1] == 4 * charges[0]


def test_a_pod_leaves_the_room_a_waiting_gang_needs() -> None:
    # x has 3 GPUs and 60 CPUs free, y 6 GPUs and 60 CPUs. A pod asking 1 GPU fits x
    # tighter; but a gang waits with two members asking 3 GPUs and 40 CPUs each, and only x
    # and y hold them. Told of the waiting gang, the pod goes to y, and the gang fits after it.
    nodes = [node("x", cpu=96, memory_gib=384), node("y", cpu=96, memory_gib=384)]
    used = [
        sized("ux", gpus=5, cpu=36, memory_gib=100, node="x"),
        sized("uy", gpus=2, cpu=36, memory_gib=100, node="y"),
    ]
    snap = snapshot(nodes, used)
    small = sized("small", gpus=1, cpu=2, memory_gib=20)
    member = Resources(40_000, 100 * GIB, 3, 1)
    assert placed(place(request([small]), snap.nodes)) == {"small": "x"}
    told = request([small], waiting=((member, 2),))
    assert placed(place(told, snap.nodes)) == {"small": "y"}


def test_the_cycle_tells_the_placement_which_gangs_wait() -> None:
    # The same two nodes, as gangs in one cycle: the high-priority pod is decided first and
    # leaves the room the waiting gang's minimum needs, which is then placed whole.
    nodes = [node("x", cpu=96, memory_gib=384), node("y", cpu=96, memory_gib=384)]
    used = [
        sized("ux", gpus=5, cpu=36, memory_gib=100, node="x"),
        sized("uy", gpus=2, cpu=36, memory_gib=100, node="y"),
    ]
    small = replace(sized("small", gpus=1, cpu=2, memory_gib=20), priority=10)
    members = [sized(f"m{i}", gpus=3, cpu=40, memory_gib=100, gang="waits") for i in range(2)]
    snap = snapshot(nodes, [*used, small, *members])
    gangs, invalid = build_gangs(snap.pods.values(), snap.pod_groups, names.SCHEDULER_NAME)
    assert invalid == []
    waits = next(g for g in gangs if g.name == "waits")
    first = next(g for g in gangs if small.key in {p.key for p in g.members})
    assert cycle.waiting_pods(gangs, first) == ((members[0].requests, 2),)
    assert cycle.waiting_pods(gangs, first, skip={waits.key}) == ()
    decisions = list(cycle.decide_in_turn(gangs, GangQueue(), snap, 0.0, cycle.Config()))
    where = {a.pod.split("/")[1]: a.node for d in decisions for a in d.bindings}
    assert where["small"] == "y"
    assert {where["m0"], where["m1"]} == {"x", "y"}
