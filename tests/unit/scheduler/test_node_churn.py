"""Nodes come and go all day on spot capacity: what the scheduler keeps per node must go with
the node, or memory grows with every node ever seen."""

from __future__ import annotations

from typing import Any

from contracts import names
from scheduler.cache import Cache
from scheduler.k8s.view import ClusterView
from scheduler.model import NodeName, PodKey
from tests.unit.scheduler.builders import node, pod


def test_the_cache_keeps_nothing_for_a_node_whose_pods_left_and_that_is_gone() -> None:
    cache = Cache()
    for i in range(100):
        name = f"spot-{i}"
        cache.set_node(node(name))
        cache.set_pod(pod(f"p{i}", node=name))
        cache.snapshot()
        cache.remove_pod(PodKey(f"ns/p{i}"))
        cache.remove_node(NodeName(name))
    cache.snapshot()
    assert cache._on_node == {}
    assert cache._states == {}


def raw_node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": {names.GPU_TOPOLOGY_ANNOTATION: "{not json"}},
        "status": {"allocatable": {"cpu": "8", "memory": "16Gi", names.GPU_RESOURCE: "8"}},
    }


def test_the_view_forgets_a_deleted_nodes_annotation_problems() -> None:
    view = ClusterView(object(), Cache(), lambda freed: None)
    for i in range(100):
        view._node_event("ADDED", raw_node(f"spot-{i}"))
        view._node_event("DELETED", raw_node(f"spot-{i}"))
    assert view._node_problems == {}
    view._node_event("ADDED", raw_node("kept"))
    view._node_event("ADDED", raw_node("relisted-away"))
    view._nodes_listed([raw_node("kept")])
    assert list(view._node_problems) == ["kept"]
