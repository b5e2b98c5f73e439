"""The feasibility verdicts kept across a cycle (scheduler.placement.fits) are exactly those of
filtering every node, along any walk over the snapshots a cycle derives — bindings, room held,
pods gone, and back to an earlier one — and a placement made with them is the one made without."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cache import Cache, Snapshot
from scheduler.model import Assignment, NodeName, PodKey, PodRequest, Resources, Taint
from scheduler.placement import Request, place
from scheduler.placement.fits import fits_of
from scheduler.placement.search import _shape
from tests.unit.scheduler.builders import node, pod
from tests.unit.scheduler.test_domains import KEYS, NODE_NAMES, POD_NAMES, apply, operations

SHAPES = [
    pod("small", gpus=0, cpu_milli=100),
    pod("one", gpus=1),
    pod("four", gpus=4, cpu_milli=30_000),
    pod("picky", gpus=1, node_selector={"shoal.dev/rack": "r1"}),
]

step = st.one_of(
    st.tuples(st.just("bind"), st.sampled_from(POD_NAMES), st.sampled_from(NODE_NAMES)),
    st.tuples(st.just("hold"), st.sampled_from(NODE_NAMES), st.integers(0, 8)),
    st.tuples(st.just("gone"), st.sampled_from(POD_NAMES), st.just("")),
    st.tuples(st.just("back"), st.integers(0, 10), st.just("")),
)


def walk(root: Snapshot, steps: list[tuple[object, ...]]) -> list[Snapshot]:
    """The snapshots a cycle could derive from ``root``, in the order it would use them."""
    seen = [root]
    current = root
    for kind, a, b in steps:
        if kind == "bind":
            key = PodKey(f"ns/{a}")
            here = current.pods.get(key)
            if here is not None and here.node is None and NodeName(str(b)) in current.nodes:
                current = current.with_assignments([Assignment(key, NodeName(str(b)))])
        elif kind == "hold":
            current = current.with_reserved([(NodeName(str(a)), Resources(1000, 0, int(b), 1))])  # type: ignore[call-overload]
        elif kind == "gone":
            current = current.without([PodKey(f"ns/{a}")])
        else:
            current = seen[int(a) % len(seen)]  # type: ignore[call-overload]
        seen.append(current)
    return seen


def verdicts(shape_pod: PodRequest, snapshot: Snapshot, *, kept: bool) -> tuple[object, ...]:
    shape = _shape(shape_pod)
    origin = snapshot.origin if kept else None
    found = fits_of(shape_pod, shape, shape[1:], snapshot.nodes, origin)
    return frozenset(found.fits), dict(found.refused)


@settings(max_examples=200, deadline=None)
@given(operations, st.lists(step, max_size=25))
def test_kept_verdicts_are_those_of_filtering_every_node(
    ops: list[tuple[object, ...]], steps: list[tuple[object, ...]]
) -> None:
    cache = Cache(topology_keys=KEYS)
    for n, op in enumerate(ops):
        apply(cache, op, now=float(n))
    cache.set_node(node("tainted", taints=(Taint("dedicated", "x", "NoSchedule"),)))
    for snapshot in walk(cache.snapshot(), steps):
        for shape_pod in SHAPES:
            assert verdicts(shape_pod, snapshot, kept=True) == verdicts(
                shape_pod, snapshot, kept=False
            )


@settings(max_examples=100, deadline=None)
@given(operations, st.lists(step, max_size=15), st.integers(1, 3), st.integers(0, 4))
def test_placing_along_a_cycle_is_placing_from_scratch(
    ops: list[tuple[object, ...]], steps: list[tuple[object, ...]], members: int, gpus: int
) -> None:
    cache = Cache(topology_keys=KEYS)
    for n, op in enumerate(ops):
        apply(cache, op, now=float(n))
    request = Request(
        gang="ns/g",  # type: ignore[arg-type]
        pods=[pod(f"g{i}", gpus=gpus) for i in range(members)],
        topology_keys=KEYS,
    )
    for snapshot in walk(cache.snapshot(), steps):
        kept = place(request, snapshot.nodes, snapshot.domains, snapshot.origin)
        assert kept == place(request, snapshot.nodes, snapshot.domains)
