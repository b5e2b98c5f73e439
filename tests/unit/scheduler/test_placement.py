"""Filters, scores and the gang placement search, on plain values."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from contracts import names
from scheduler.model import (
    GangKey,
    Node,
    NodeName,
    Placement,
    PodRequest,
    SelectorRequirement,
    SelectorTerm,
    Taint,
    Toleration,
    Unschedulable,
)
from scheduler.placement import Request, filters, place
from tests.unit.scheduler.builders import node, pod, snapshot

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
