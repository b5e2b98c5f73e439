"""Fake GPU nodes are laid out as a user asked: racks, zones, spot share, GPUs, topology."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts import gputopology, names
from devcluster.nodes import NodeSpec, layout, node_manifest


def test_sixteen_nodes_two_racks_half_spot() -> None:
    spec = NodeSpec(count=16, gpus=8, spot_fraction=0.5, racks_per_zone=2)
    nodes = [node_manifest(spec, i) for i in range(16)]
    labels = [n["metadata"]["labels"] for n in nodes]
    assert Counter(lab[names.RACK_LABEL] for lab in labels) == {"rack-0": 8, "rack-1": 8}
    per_rack_spot = Counter(lab[names.RACK_LABEL] for lab in labels if names.is_spot(lab))
    assert per_rack_spot == {"rack-0": 4, "rack-1": 4}
    first = nodes[0]
    assert first["status"]["allocatable"][names.GPU_RESOURCE] == "8"
    assert first["metadata"]["annotations"][names.KWOK_NODE_ANNOTATION] == "fake"
    assert first["spec"]["taints"][0]["key"] == names.KWOK_TAINT
    topo = gputopology.decode(first["metadata"]["annotations"][names.GPU_TOPOLOGY_ANNOTATION])
    assert topo.largest_free_island() == 4


def test_cpu_only_nodes_have_no_gpu_facts() -> None:
    node = node_manifest(NodeSpec(count=1, gpus=0, kwok_taint=False), 0)
    assert names.GPU_RESOURCE not in node["status"]["allocatable"]
    assert names.GPU_TOPOLOGY_ANNOTATION not in node["metadata"]["annotations"]
    assert node["spec"]["taints"] == []


@given(
    count=st.integers(min_value=1, max_value=300),
    zones=st.integers(min_value=1, max_value=4),
    racks=st.integers(min_value=1, max_value=8),
    spot=st.sampled_from([0.0, 0.25, 0.5, 1.0]),
)
def test_layout_fills_racks_evenly_and_in_order(
    count: int, zones: int, racks: int, spot: float
) -> None:
    spec = NodeSpec(count=count, zones=zones, racks_per_zone=racks, spot_fraction=spot)
    placed = [layout(spec, i) for i in range(count)]
    rack_ids = [rack for _zone, rack, _spot in placed]
    assert rack_ids == sorted(rack_ids)
    sizes = Counter(rack_ids).values()
    assert max(sizes) - min(sizes) <= 1
    assert all(zone == rack // racks for zone, rack, _ in placed)
    if spot == 0.0:
        assert not any(s for *_, s in placed)
    if spot == 1.0:
        assert all(s for *_, s in placed)


@pytest.mark.parametrize(
    "bad",
    [
        {"count": -1},
        {"count": 1, "spot_fraction": 1.5},
        {"count": 1, "island_size": 0},
        {"count": 1, "zones": 0},
    ],
)
def test_invalid_specs_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"must be|>="):
        NodeSpec(**bad)  # type: ignore[arg-type]
