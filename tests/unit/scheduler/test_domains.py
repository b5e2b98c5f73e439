"""The per-domain free capacity the cache keeps equals the sum recomputed from the nodes, after
any sequence of node and pod changes, assumes, forgets and expiries, and in the snapshots a
cycle derives; and a placement made with it is the one made by summing."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from contracts import names
from scheduler.cache import Cache, Snapshot
from scheduler.model import Assignment, NodeName, PodKey, Resources
from scheduler.placement import Request, place
from scheduler.topology.domains import Domains
from tests.unit.scheduler.builders import node, pod

KEYS = (names.ZONE_LABEL, names.RACK_LABEL)
NODE_NAMES = [f"n{i}" for i in range(6)]
POD_NAMES = [f"p{i}" for i in range(10)]


def recomputed(snapshot: Snapshot) -> dict[str, dict[str, tuple[frozenset[NodeName], Resources]]]:
    """Per key and value: the nodes carrying it and their free capacity, summed from scratch."""
    members: dict[str, dict[str, set[NodeName]]] = {k: defaultdict(set) for k in KEYS}
    free: dict[str, dict[str, Resources]] = {k: defaultdict(Resources) for k in KEYS}
    for name, state in snapshot.nodes.items():
        for key in KEYS:
            value = state.node.labels.get(key)
            if value is not None:
                members[key][value].add(name)
                free[key][value] = free[key][value] + state.free
    return {
        key: {v: (frozenset(members[key][v]), free[key][v]) for v in members[key]} for key in KEYS
    }


def kept(domains: Domains) -> dict[str, dict[str, tuple[frozenset[NodeName], Resources]]]:
    found = {}
    for key in KEYS:
        values = domains.of(key)
        assert values is not None
        found[key] = {v: (d.members, d.free) for v, d in values.items()}
    return found


node_op = st.tuples(
    st.just("node"),
    st.sampled_from(NODE_NAMES),
    st.sampled_from(["r0", "r1", "r2", None]),
    st.sampled_from(["za", "zb"]),
    st.integers(0, 8),
)
pod_op = st.tuples(
    st.just("pod"),
    st.sampled_from(POD_NAMES),
    st.sampled_from([*NODE_NAMES, None]),
    st.integers(0, 4),
    st.booleans(),  # finished
)
simple_op = st.tuples(
    st.sampled_from(["remove_node", "remove_pod", "assume", "forget", "expire", "relist", "snap"]),
    st.sampled_from(NODE_NAMES),
    st.sampled_from(POD_NAMES),
)
operations = st.lists(st.one_of(node_op, pod_op, simple_op), max_size=60)


def apply(cache: Cache, op: tuple[object, ...], now: float) -> None:
    kind = op[0]
    if kind == "node":
        _, name, rack, zone, gpus = op
        cache.set_node(node(str(name), rack=rack, zone=str(zone), gpus=int(str(gpus))))  # type: ignore[arg-type]
    elif kind == "pod":
        _, name, where, gpus, finished = op
        made = pod(str(name), gpus=int(str(gpus)), node=where)  # type: ignore[arg-type]
        if finished:
            made = replace(made, phase=made.phase.SUCCEEDED)
        cache.set_pod(made)
    elif kind == "remove_node":
        cache.remove_node(NodeName(str(op[1])))
    elif kind == "remove_pod":
        cache.remove_pod(PodKey(f"ns/{op[2]}"))
    elif kind == "assume":
        cache.assume([Assignment(PodKey(f"ns/{op[2]}"), NodeName(str(op[1])))], now)
    elif kind == "forget":
        cache.forget(PodKey(f"ns/{op[2]}"))
    elif kind == "expire":
        cache.expire(now)
    elif kind == "relist":
        snap = cache.snapshot()
        cache.replace_nodes(s.node for n, s in snap.nodes.items() if n != op[1])
    else:
        cache.snapshot()


@settings(max_examples=300, deadline=None)
@given(operations)
def test_the_kept_totals_equal_the_recomputed_sums(ops: list[tuple[object, ...]]) -> None:
    cache = Cache(assume_ttl=5.0, topology_keys=KEYS)
    for step, op in enumerate(ops):
        apply(cache, op, now=float(step))
        if op[0] == "snap" or step % 7 == 0:
            snapshot = cache.snapshot()
            assert kept(snapshot.domains) == recomputed(snapshot)
    snapshot = cache.snapshot()
    assert kept(snapshot.domains) == recomputed(snapshot)


@settings(max_examples=200, deadline=None)
@given(operations, st.lists(st.tuples(st.sampled_from(POD_NAMES), st.sampled_from(NODE_NAMES))))
def test_derived_snapshots_keep_them_equal_too(
    ops: list[tuple[object, ...]], moves: list[tuple[str, str]]
) -> None:
    """Bindings placed, room held and pods gone inside a cycle move the totals with the nodes."""
    cache = Cache(topology_keys=KEYS)
    for step, op in enumerate(ops):
        apply(cache, op, now=float(step))
    snapshot = cache.snapshot()
    unbound = {p.key for p in snapshot.pods.values() if p.node is None}
    assignments = [
        Assignment(PodKey(f"ns/{p}"), NodeName(n))
        for p, n in dict(moves).items()
        if PodKey(f"ns/{p}") in unbound and NodeName(n) in snapshot.nodes
    ]
    placed = snapshot.with_assignments(assignments)
    assert kept(placed.domains) == recomputed(placed)
    held = placed.with_reserved((NodeName(n), Resources(100, 0, 1, 1)) for _, n in moves)
    assert kept(held.domains) == recomputed(held)
    gone = held.without(PodKey(f"ns/{p}") for p, _ in moves[::2])
    assert kept(gone.domains) == recomputed(gone)


@settings(max_examples=150, deadline=None)
@given(
    operations,
    st.integers(0, 4),
    st.integers(1, 3),
    st.sampled_from([None, names.RACK_LABEL, names.ZONE_LABEL]),
)
def test_placing_with_the_totals_is_placing_by_summing(
    ops: list[tuple[object, ...]], gpus: int, members: int, required: str | None
) -> None:
    cache = Cache(topology_keys=KEYS)
    for step, op in enumerate(ops):
        apply(cache, op, now=float(step))
    snapshot = cache.snapshot()
    request = Request(
        gang="ns/g",  # type: ignore[arg-type]
        pods=[pod(f"g{i}", gpus=gpus) for i in range(members)],
        topology_keys=KEYS,
        required=required,
    )
    assert place(request, snapshot.nodes, snapshot.domains) == place(request, snapshot.nodes)
