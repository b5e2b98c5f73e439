"""The gpu-topology annotation: what the agent writes, the scheduler can read back exactly, and
anything malformed is refused with a message naming the field."""

from __future__ import annotations

import contextlib
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts import gputopology
from contracts.gputopology import TopologyError


def test_two_islands_of_four() -> None:
    topo = gputopology.uniform(8, 4, node_name="n1")
    assert topo.islands() == {0: frozenset({0, 1, 2, 3}), 1: frozenset({4, 5, 6, 7})}
    assert topo.links[0][1] == "NV18"
    assert topo.links[0][4] == "SYS"  # islands sit on different NUMA nodes
    assert topo.largest_free_island() == 4


def test_scattered_allocations_leave_no_whole_island() -> None:
    topo = gputopology.uniform(8, 4)
    busy = gputopology.GpuTopology(
        gpus=topo.gpus, links=topo.links, allocated={0: "ns/a", 4: "ns/b"}
    )
    assert busy.largest_free_island() == 3
    assert busy.free() == frozenset({1, 2, 3, 5, 6, 7})


def test_failed_gpu_is_not_free() -> None:
    topo = gputopology.uniform(4, 4)
    doc = json.loads(gputopology.encode(topo))
    doc["gpus"][2]["health"] = "failed"
    assert gputopology.decode(json.dumps(doc)).free() == frozenset({0, 1, 3})


@given(
    gpus=st.integers(min_value=0, max_value=16),
    island=st.integers(min_value=1, max_value=8),
    numa=st.integers(min_value=1, max_value=4),
    allocated=st.sets(st.integers(min_value=0, max_value=15)),
)
def test_round_trip(gpus: int, island: int, numa: int, allocated: set[int]) -> None:
    topo = gputopology.uniform(gpus, island, numa_nodes=numa, product="H100")
    topo = gputopology.GpuTopology(
        gpus=topo.gpus,
        links=topo.links,
        allocated={i: f"ns/p{i}" for i in allocated if i < gpus},
        product=topo.product,
    )
    assert gputopology.decode(gputopology.encode(topo)) == topo


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.update(version=2), "version"),
        (lambda d: d["gpus"][1].update(index=0), "gpus: indices"),
        (lambda d: d["gpus"][0].update(uuid=""), "gpus[0].uuid"),
        (lambda d: d["gpus"][0].update(health="meh"), "gpus[0].health"),
        (lambda d: d["gpus"][0].update(island=-1), "gpus[0].island"),
        (lambda d: d["links"][0].__setitem__(1, "NVX"), "links[0][1]"),
        (lambda d: d["links"].pop(), "links"),
        (lambda d: d["links"][0].__setitem__(0, "PIX"), "links[0][0]"),
        (lambda d: d["links"][0].__setitem__(1, "PIX"), "symmetric"),
        (lambda d: d["gpus"][3].update(island=1), "NVLink between GPUs of islands"),
        (lambda d: d.update(allocated={"9": "ns/p"}), "allocated"),
        (lambda d: d.update(allocated={"0": ""}), "allocated[0]"),
    ],
)
def test_malformed_documents_name_the_field(mutate: object, field: str) -> None:
    doc = json.loads(gputopology.encode(gputopology.uniform(4, 4)))
    assert callable(mutate)
    mutate(doc)
    with pytest.raises(TopologyError, match=re.escape(field)):
        gputopology.decode(json.dumps(doc))


@given(st.text(max_size=200))
def test_arbitrary_text_is_refused_cleanly_or_parsed(text: str) -> None:
    # Anything but a TopologyError (a crash) fails the test.
    with contextlib.suppress(TopologyError):
        gputopology.decode(text)


def test_oversized_document_refused_before_parsing() -> None:
    with pytest.raises(TopologyError, match="larger than"):
        gputopology.decode(" " * (gputopology.MAX_DOCUMENT_BYTES + 1))


@pytest.mark.parametrize("health", [[], {}, ["failed"]])
def test_a_health_that_is_not_a_string_names_the_field(health: object) -> None:
    # An unhashable health was a TypeError, which the scheduler's node conversion (it expects
    # a TopologyError) did not catch.
    doc = json.loads(gputopology.encode(gputopology.uniform(4, 4)))
    doc["gpus"][1]["health"] = health
    with pytest.raises(TopologyError, match=re.escape("gpus[1].health")):
        gputopology.decode(json.dumps(doc))
