"""Gang placement search: a node for every pod asked for, or none at all.

``place`` is pure (the static filters' verdicts are memoised per node object, which changes
nothing it returns). It filters nodes per distinct pod shape, then looks for the narrowest topology
domain that holds every pod: first a single value of the narrowest configured label (a rack),
then wider ones (block, zone, region), and only then the whole cluster, where members stick to
the racks already chosen. ``shoal.dev/topology-required`` turns that into a hard constraint: one
value of that label or nothing. Inside a domain, pods are assigned greedily, biggest first, to
the best-scoring node that still has room, with the room updated after each pod, so a placement
never asks a node for more than it has free.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from scheduler import topology
from scheduler.model import (
    Assignment,
    GangKey,
    NodeName,
    NodeState,
    Placement,
    PodKey,
    PodRequest,
    Resources,
    Unschedulable,
)
from scheduler.placement import filters
from scheduler.placement.score import DEFAULT_WEIGHTS, Weights, node_score


@dataclass(frozen=True, slots=True)
class Request:
    """What to place: ``pods`` all or none; constraints of their gang."""

    gang: GangKey
    pods: Sequence[PodRequest]
    #: Node label keys, widest first (region ... rack).
    topology_keys: Sequence[str]
    required: str | None = None
    preferred: str | None = None
    #: Surplus members prefer spot capacity; the minimum quorum prefers on-demand.
    surplus: bool = False
    #: Nodes that already run members of the gang (they pull new members into their domains).
    bound_nodes: Sequence[NodeName] = ()
    weights: Weights = field(default=DEFAULT_WEIGHTS)


def _shape(pod: PodRequest) -> tuple[object, ...]:
    return (
        pod.requests,
        tuple(sorted(pod.node_selector.items())),
        pod.affinity,
        pod.tolerations,
    )


def place(request: Request, nodes: Mapping[NodeName, NodeState]) -> Placement | Unschedulable:
    pods = sorted(request.pods, key=lambda p: (-p.requests.gpu, -p.requests.cpu_milli, p.name))
    if not pods:
        return Placement(request.gang, ())
    total = len(nodes)

    # 1. Filter once per distinct pod shape.
    by_shape: dict[tuple[object, ...], list[NodeName]] = {}
    feasible: dict[PodKey, list[NodeName]] = {}
    for pod in pods:
        shape = _shape(pod)
        if shape not in by_shape:
            fits: list[NodeName] = []
            reasons: Counter[str] = Counter()
            static = filters.static_verdicts(shape[1:])
            for name in sorted(nodes):
                state = nodes[name]
                known = static.get(name)
                if known is not None and known[0] is state.node:
                    reason = known[1]
                else:
                    reason = filters.first_static_failure(pod, state)
                    static[name] = (state.node, reason)
                if reason is None:
                    reason = filters.resources(pod, state)
                if reason is None:
                    fits.append(name)
                else:
                    reasons[reason] += 1
            if not fits:
                return Unschedulable(total, dict(reasons))
            by_shape[shape] = fits
        feasible[pod.key] = by_shape[shape]

    union: set[NodeName] = set()
    for names_ in by_shape.values():
        union.update(names_)
    need = Resources(
        sum(p.requests.cpu_milli for p in pods),
        sum(p.requests.memory for p in pods),
        sum(p.requests.gpu for p in pods),
        len(pods),
    )

    def attempt(candidates: set[NodeName], key: str | None) -> Placement | None:
        assignments = _greedy(
            request, pods, feasible=feasible, candidates=candidates, nodes=nodes, together_key=key
        )
        if assignments is None:
            return None
        return Placement(request.gang, assignments, _domains(assignments, nodes, request))

    bound_domain: dict[str, str] = {}
    for key in request.topology_keys:
        values = {nodes[n].node.labels.get(key) for n in request.bound_nodes if n in nodes}
        only = values.pop() if len(values) == 1 else None
        if only is not None:
            bound_domain[key] = only

    # 2. A required domain: one value of the label, or nothing.
    if request.required:
        key = request.required
        if not any(key in state.node.labels for state in nodes.values()):
            return Unschedulable(
                total,
                summary=f"topology key {key!r} (shoal.dev/topology-required) is not a label "
                "of any node;",
            )
        groups = _group(union, nodes, key)
        if request.bound_nodes:
            wanted = {nodes[n].node.labels.get(key) for n in request.bound_nodes if n in nodes}
            groups = {v: g for v, g in groups.items() if v in wanted}
        for _, group in _tightest_first(groups, nodes, need):
            found = attempt(group, key)
            if found is not None:
                return found
        return Unschedulable(
            total,
            summary=f"no single {key} has room for all {len(pods)} member(s) "
            f"(shoal.dev/topology-required={key});",
        )

    # 3. Narrowest domain that holds every pod, then wider ones, then anywhere.
    levels = [k for k in reversed(request.topology_keys) if k != request.preferred]
    if request.preferred:
        levels.insert(0, request.preferred)
    narrowest = next((k for k in levels if any(k in nodes[n].node.labels for n in union)), None)
    for key in levels:
        groups = _group(union, nodes, key)
        if not groups or (len(groups) == 1 and len(next(iter(groups.values()))) == len(union)):
            continue
        value = bound_domain.get(key)
        if value is not None and value in groups:
            ordered = [(value, groups[value])] + [
                (v, g) for v, g in _tightest_first(groups, nodes, need) if v != value
            ]
        else:
            ordered = _tightest_first(groups, nodes, need)
        for _, group in ordered:
            found = attempt(group, narrowest)
            if found is not None:
                return found
    found = attempt(union, narrowest)
    if found is not None:
        return found
    return Unschedulable(
        total,
        summary=f"each member fits some node, but the {len(pods)} member(s) do not fit together;",
    )


def _group(
    candidates: Iterable[NodeName], nodes: Mapping[NodeName, NodeState], key: str
) -> dict[str, set[NodeName]]:
    groups: dict[str, set[NodeName]] = defaultdict(set)
    for name in candidates:
        value = nodes[name].node.labels.get(key)
        if value is not None:
            groups[value].add(name)
    return groups


def _tightest_first(
    groups: Mapping[str, set[NodeName]], nodes: Mapping[NodeName, NodeState], need: Resources
) -> list[tuple[str, set[NodeName]]]:
    """Domains whose free total covers ``need``, the one with the least room left first."""
    sized: list[tuple[int, int, str, set[NodeName]]] = []
    for value, group in groups.items():
        cpu = memory = gpu = pods = 0
        for name in group:
            free = nodes[name].free
            cpu += free.cpu_milli
            memory += free.memory
            gpu += free.gpu
            pods += free.pods
        if Resources(cpu, memory, gpu, pods).covers(need):
            sized.append((gpu - need.gpu, cpu, value, group))
    sized.sort(key=lambda item: (item[0], item[1], item[2]))
    return [(value, group) for _, _, value, group in sized]


def _greedy(
    request: Request,
    pods: Sequence[PodRequest],
    *,
    feasible: Mapping[PodKey, list[NodeName]],
    candidates: set[NodeName],
    nodes: Mapping[NodeName, NodeState],
    together_key: str | None,
) -> tuple[Assignment, ...] | None:
    free: dict[NodeName, Resources] = {}
    islands: dict[NodeName, tuple[int, ...] | None] = {}
    used: set[str] = set()
    if together_key is not None:
        for name in request.bound_nodes:
            if name in nodes and together_key in nodes[name].node.labels:
                used.add(nodes[name].node.labels[together_key])
    assignments: list[Assignment] = []
    for pod in pods:
        best = 0.0
        best_name: NodeName | None = None
        for name in feasible[pod.key]:
            if name not in candidates:
                continue
            state = nodes[name]
            room = free.get(name)
            if room is None:
                room = free[name] = state.free
                islands[name] = state.islands
            if filters.resources_fit(pod.requests, room) is not None:
                continue
            value = state.node.labels.get(together_key) if together_key is not None else None
            score = node_score(
                pod.requests,
                state.node,
                room,
                islands[name],
                surplus=request.surplus,
                together=value is not None and value in used,
                weights=request.weights,
            )
            # Highest score; nodes come in name order, so ties go to the first name.
            if best_name is None or score > best:
                best, best_name = score, name
        if best_name is None:
            return None
        room = free[best_name] - pod.requests
        after = islands[best_name]
        if after is not None:
            after = topology.take(after, pod.requests.gpu)
            room = Resources(room.cpu_milli, room.memory, min(room.gpu, sum(after)), room.pods)
        free[best_name] = room
        islands[best_name] = after
        if together_key is not None:
            value = nodes[best_name].node.labels.get(together_key)
            if value is not None:
                used.add(value)
        assignments.append(Assignment(pod.key, best_name))
    return tuple(assignments)


def _domains(
    assignments: Sequence[Assignment], nodes: Mapping[NodeName, NodeState], request: Request
) -> dict[str, int]:
    keys = list(request.topology_keys)
    for extra in (request.required, request.preferred):
        if extra and extra not in keys:
            keys.append(extra)
    counts: dict[str, int] = {}
    for key in keys:
        values = {nodes[a.node].node.labels.get(key) for a in assignments}
        values.discard(None)
        if values:
            counts[key] = len(values)
    return counts
