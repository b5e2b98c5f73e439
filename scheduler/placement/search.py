"""Gang placement search: a node for every pod asked for, or none at all.

``place`` is pure (the static filters' verdicts are memoised per node object, which changes
nothing it returns). It filters nodes per distinct pod shape, then looks for the narrowest topology
domain that holds every pod: first a single value of the narrowest configured label (a rack),
then wider ones (block, zone, region), and only then the whole cluster, where members stick to
the racks already chosen. ``shoal.dev/topology-required`` turns that into a hard constraint: one
value of that label or nothing. Inside a domain, pods are assigned greedily, biggest first, to
the best-scoring node that still has room, with the room updated after each pod, so a placement
never asks a node for more than it has free.

Domains are ranked by the free capacity of the nodes the gang can use. With the snapshot's
per-domain totals (:mod:`scheduler.topology.domains`), that is each domain's total minus what the
nodes no member fits on hold: a pass over those few nodes, not over every feasible one.
"""

from __future__ import annotations

import zlib
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace

from scheduler import topology
from scheduler.model import (
    Assignment,
    GangKey,
    NodeName,
    NodesOrigin,
    NodeState,
    Placement,
    PodKey,
    PodRequest,
    Resources,
    Unschedulable,
)
from scheduler.placement import filters
from scheduler.placement.demand import Demand, demand_of
from scheduler.placement.fits import Fits, fits_of
from scheduler.placement.risk import MAX_QUORUM_RISK_ANNOTATION, Pool, chance_below, pool_of
from scheduler.placement.score import DEFAULT_WEIGHTS, Weights, node_score
from scheduler.placement.shapes import Likely
from scheduler.topology.domains import Domain, Domains


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
    #: The pods other gangs' minimums wait with (requests, how many): a placement that takes
    #: the last nodes they fit on costs more (:mod:`scheduler.placement.demand`).
    waiting: Sequence[tuple[Resources, int]] = ()
    #: The pod shapes and gang sizes that arrived lately (a
    #: :class:`~scheduler.placement.shapes.ShapeLedger`'s): what a placement takes from them
    #: counts beside what it takes from the shares of the node shapes, and a gang's leftover in
    #: a domain is charged only when it is too small for every gang that comes.
    likely: Likely = field(default_factory=Likely)
    #: Revocations per node-hour of each capacity pool (:mod:`scheduler.placement.risk`): a
    #: minimum quorum goes to the lowest-risk capacity that holds it.
    revocation: Mapping[Pool, float] = field(default_factory=dict)
    #: The most the quorum may risk of losing a member within an hour
    #: (``shoal.dev/max-quorum-risk``); ``None``: no bound.
    max_quorum_risk: float | None = None


def _shape(pod: PodRequest) -> tuple[object, ...]:
    return (
        pod.requests,
        tuple(sorted(pod.node_selector.items())),
        pod.affinity,
        pod.tolerations,
    )


def place(
    request: Request,
    nodes: Mapping[NodeName, NodeState],
    domains: Domains | None = None,
    origin: NodesOrigin | None = None,
) -> Placement | Unschedulable:
    """Nodes for all of ``request.pods`` on ``nodes``, or why there are none.

    ``domains`` are the per-domain free totals of exactly ``nodes`` (a snapshot's); without
    them, or for a key they do not track, domains are summed here. ``origin`` says which cache
    snapshot ``nodes`` derive from (a snapshot's ``origin``), so that only the nodes changed
    since are filtered again; without it every node is.

    The steps: find the nodes each pod could run on by itself (:func:`_feasible`); then, with a
    required topology key, try one domain of it at a time (:func:`_in_required_domain`);
    otherwise try the narrowest domains first, then wider ones, then the whole cluster
    (:func:`_narrowest_first`). Each try is a greedy assignment on the nodes of the domain.
    """
    pods = sorted(request.pods, key=lambda p: (-p.requests.gpu, -p.requests.cpu_milli, p.name))
    if not pods:
        return Placement(request.gang, ())
    feasible = _feasible(pods, nodes, origin)
    if isinstance(feasible, Unschedulable):
        return feasible
    weights = request.weights
    demand = (
        demand_of(nodes, request.waiting, request.likely)
        if weights.fragment or weights.plentiful
        else None
    )
    search = _Search(request, pods, nodes, *feasible, domains=domains, demand=demand)
    if not request.surplus and any(request.revocation.values()):
        return _lowest_risk_first(search)
    return _search(search)


def _search(search: _Search) -> Placement | Unschedulable:
    if search.request.required:
        return _in_required_domain(search, search.request.required)
    return _narrowest_first(search)


#: How many levels of risk a quorum tries, safest first (the riskiest level is all the nodes).
RISK_LEVELS = 6


def _lowest_risk_first(search: _Search) -> Placement | Unschedulable:
    """A minimum quorum on the lowest-risk capacity that holds it: the search on the nodes
    whose pool is revoked no more often than each level in turn, safest first, the last level
    being every node. With ``max_quorum_risk``, a placement whose chance of losing a member
    within an hour is above it is no placement."""
    request, nodes = search.request, search.nodes
    rates = request.revocation
    risk = {name: rates.get(pool_of(nodes[name].node), 0.0) for name in search.union}
    levels = sorted(set(risk.values()))
    if len(levels) > RISK_LEVELS:
        levels = [*levels[: RISK_LEVELS - 1], levels[-1]]
    found: Placement | Unschedulable | None = None
    for level in levels[:-1]:
        narrower = search.within(frozenset(n for n, r in risk.items() if r <= level))
        if narrower is None:
            continue
        found = _search(narrower)
        if isinstance(found, Placement):
            break
    if not isinstance(found, Placement):
        found = _search(search)
    if isinstance(found, Unschedulable) or request.max_quorum_risk is None:
        return found
    chance = chance_below([risk[a.node] for a in found.assignments])
    if chance <= request.max_quorum_risk:
        return found
    return Unschedulable(
        len(nodes),
        summary=f"the lowest-risk capacity that holds the {len(search.pods)} member(s) risks "
        f"{chance:.1%} of losing one within an hour, above the {request.max_quorum_risk:.1%} "
        f"{MAX_QUORUM_RISK_ANNOTATION} allows; waiting for safer capacity;",
    )


def _feasible(
    pods: Sequence[PodRequest],
    nodes: Mapping[NodeName, NodeState],
    origin: NodesOrigin | None,
) -> tuple[dict[PodKey, Set[NodeName]], Set[NodeName], Set[NodeName] | None] | Unschedulable:
    """Per pod, the nodes it fits on by itself, filtered once per distinct pod shape (and, along
    a cycle's lineage, only where nodes changed: :mod:`scheduler.placement.fits`); every node
    some pod fits on; and, when all pods have one shape, the nodes none fits on. If some pod
    fits no node, why not, counted per node by the first filter that refused it."""
    by_shape: dict[tuple[object, ...], Fits] = {}
    feasible: dict[PodKey, Set[NodeName]] = {}
    for pod in pods:
        shape = _shape(pod)
        if shape not in by_shape:
            verdicts = fits_of(pod, shape, shape[1:], nodes, origin)
            if not verdicts.fits:
                return Unschedulable(len(nodes), dict(Counter(verdicts.refused.values())))
            by_shape[shape] = verdicts
        feasible[pod.key] = by_shape[shape].fits
    if len(by_shape) == 1:
        only = next(iter(by_shape.values()))
        return feasible, only.fits, only.refused.keys()
    return feasible, frozenset(n for v in by_shape.values() for n in v.fits), None


#: How many domains that hold a gang a search compares by what they cost the likely pods.
DOMAIN_CHOICES = 8


@dataclass(frozen=True, slots=True)
class _Search:
    """One placement search: the pods (biggest first), where each could go, and what they
    need together."""

    request: Request
    pods: Sequence[PodRequest]
    nodes: Mapping[NodeName, NodeState]
    feasible: Mapping[PodKey, Set[NodeName]]
    #: Every node some pod fits on.
    union: Set[NodeName]
    #: The nodes no pod fits on (``nodes`` less ``union``), when known; else found on first use.
    known_outside: Set[NodeName] | None
    #: Free capacity per domain of ``nodes``, when the snapshot keeps it.
    domains: Domains | None = None
    #: The expected workload, when the weights score the cost to it.
    demand: Demand | None = None
    #: What the pods ask for together.
    need: Resources = field(init=False)
    _outside: list[Set[NodeName]] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        need = Resources(
            sum(p.requests.cpu_milli for p in self.pods),
            sum(p.requests.memory for p in self.pods),
            sum(p.requests.gpu for p in self.pods),
            len(self.pods),
        )
        object.__setattr__(self, "need", need)

    def within(self, allowed: Set[NodeName]) -> _Search | None:
        """The same search on the ``allowed`` nodes only; ``None`` when some pod fits none."""
        feasible = {key: fits & allowed for key, fits in self.feasible.items()}
        if not all(feasible.values()):
            return None
        return replace(self, feasible=feasible, union=self.union & allowed, known_outside=None)

    @property
    def outside(self) -> Set[NodeName]:
        """The nodes no pod fits on."""
        if self.known_outside is not None:
            return self.known_outside
        if not self._outside:
            self._outside.append(frozenset(self.nodes.keys() - self.union))
        return self._outside[0]

    def attempt(
        self, candidates: Collection[NodeName], key: str | None, spent: list[float] | None = None
    ) -> Placement | None:
        """Every pod on ``candidates`` (members drawn together on ``key``), or ``None``. What
        the placement costs the likely pods is added to ``spent``, when given."""
        assignments = _greedy(
            self.request,
            self.pods,
            feasible=self.feasible,
            candidates=candidates,
            nodes=self.nodes,
            together_key=key,
            demand=self.demand,
            spent=spent,
        )
        if assignments is None:
            return None
        return Placement(
            self.request.gang, assignments, _domains(assignments, self.nodes, self.request)
        )

    def leftover(self, gpus: int) -> float:
        """What leaving ``gpus`` free in a domain costs a gang's placement: per GPU as a node's
        tight fit counts them, when they are too few for every gang that arrived lately (or
        none is known), and nothing when some gang that comes could use them. A rack is then
        not left with one node no gang can fill (those GPUs stay free for good) while another
        rack holds the gang with room to spare; among racks whose leftover some gang can use,
        the tightest still comes first."""
        if gpus <= 0 or not self.request.likely.unusable(gpus):
            return 0.0
        return self.request.weights.domain_left * gpus

    def first_fit(
        self,
        domains: Iterable[tuple[str, Collection[NodeName]]],
        key: str | None,
        left: Mapping[str, int] | None = None,
    ) -> Placement | None:
        """The placement in the first of ``domains`` (in order) that holds every pod; for a
        gang of several pods with a demand, the one of the first :data:`DOMAIN_CHOICES` that
        hold every pod that scores best (the earliest among equals): what the placement costs
        the likely pods, plus what the GPUs it leaves free in the domain cost (``left``: each
        domain's free GPUs less the gang's; :meth:`leftover`), so that a gang neither takes the
        only domain a bigger gang could use nor leaves a domain too broken for the next gang
        when one it fills exactly is at hand. A lone pod
        takes the first (the tightest), which keeps the other domains whole for gangs."""
        if self.demand is None or len(self.pods) < 2:
            for _, group in domains:
                found = self.attempt(group, key)
                if found is not None:
                    return found
            return None
        best: Placement | None = None
        best_cost = 0.0
        choices = 0
        for value, group in domains:
            spent = [0.0]
            found = self.attempt(group, key, spent)
            if found is None:
                continue
            cost = spent[0] + (self.leftover(left.get(value, 0)) if left is not None else 0.0)
            if best is None or cost < best_cost:
                best, best_cost = found, cost
            choices += 1
            # The domains come tightest first: one that costs the likely pods nothing is
            # beaten by none after it.
            if choices >= DOMAIN_CHOICES or spent[0] <= 0.0:
                break
        return best


def _in_required_domain(search: _Search, key: str) -> Placement | Unschedulable:
    """``shoal.dev/topology-required``: every pod in one value of ``key`` (the one the gang's
    bound members are in, if any), the tightest that has room first; or nothing."""
    nodes, total = search.nodes, len(search.nodes)
    if not any(key in state.node.labels for state in nodes.values()):
        return Unschedulable(
            total,
            summary=f"topology key {key!r} (shoal.dev/topology-required) is not a label "
            "of any node;",
        )
    groups = _usable(search, key)
    bound = search.request.bound_nodes
    if bound:
        wanted = {nodes[n].node.labels.get(key) for n in bound if n in nodes}
        groups = {v: g for v, g in groups.items() if v in wanted}
    found = search.first_fit(_tightest_first(groups, search.need), key, _left(groups, search.need))
    if found is not None:
        return found
    return Unschedulable(
        total,
        _why_no_domain(search, key, groups),
        summary=f"no single {key} has room for all {len(search.pods)} member(s) "
        f"(shoal.dev/topology-required={key});",
    )


def _why_no_domain(search: _Search, key: str, groups: Mapping[str, _Usable]) -> dict[str, int]:
    """Per node, why a required-domain gang cannot go there, as kube-scheduler counts nodes
    for one pod: in the domain that came closest (placed the most members), why the member
    left over does not fit once those before it are placed; every other node is in another
    domain, or has no value of ``key`` at all."""
    closest: tuple[str, _Stuck] | None = None
    for value, group in sorted(groups.items()):
        stuck = _assign(
            search.request,
            search.pods,
            feasible=search.feasible,
            candidates=group.nodes,
            nodes=search.nodes,
            together_key=key,
            demand=search.demand,
        )
        if isinstance(stuck, _Stuck) and (closest is None or stuck.placed > closest[1].placed):
            closest = (value, stuck)
    reasons: Counter[str] = Counter()
    for name, state in search.nodes.items():
        label = state.node.labels.get(key)
        if label is None:
            reasons[f"node(s) had no {key} label"] += 1
        elif closest is None or label != closest[0]:
            reasons[f"node(s) in another {key} than the gang's closest fit"] += 1
        elif name in search.feasible[closest[1].pod.key]:
            room = closest[1].room.on(name)[0]
            short = filters.resources_fit(closest[1].pod.requests, room)
            reasons[short or "no room left once the other members are placed"] += 1
        else:
            reasons[filters.first_failure(closest[1].pod, state) or "does not fit"] += 1
    return dict(reasons)


def _narrowest_first(search: _Search) -> Placement | Unschedulable:
    """The narrowest domain that holds every pod: the preferred key's domains first, then one
    rack, then wider levels, then anywhere; members are drawn together on the narrowest key
    the feasible nodes carry."""
    request, nodes = search.request, search.nodes
    levels = [k for k in reversed(request.topology_keys) if k != request.preferred]
    if request.preferred:
        levels.insert(0, request.preferred)
    narrowest = next((k for k in levels if _carried(search, k)), None)
    bound = _bound_domains(request, nodes)
    for key in levels:
        groups = _usable(search, key)
        found = search.first_fit(
            _domains_to_try(search, groups, bound.get(key)), narrowest, _left(groups, search.need)
        )
        if found is not None:
            return found
    found = search.attempt(search.union, narrowest)
    if found is not None:
        return found
    return _not_together(search, narrowest)


def _bound_domains(request: Request, nodes: Mapping[NodeName, NodeState]) -> dict[str, str]:
    """Per topology key, the one value every bound member's node has (keys where they are
    spread over several values, or have none, are left out)."""
    bound_domain: dict[str, str] = {}
    for key in request.topology_keys:
        values = {nodes[n].node.labels.get(key) for n in request.bound_nodes if n in nodes}
        only = values.pop() if len(values) == 1 else None
        if only is not None:
            bound_domain[key] = only
    return bound_domain


def _left(groups: Mapping[str, _Usable], need: Resources) -> dict[str, int]:
    """Per domain, the GPUs it would have free once ``need`` is placed in it."""
    return {value: domain.free.gpu - need.gpu for value, domain in groups.items()}


def _domains_to_try(
    search: _Search, groups: Mapping[str, _Usable], bound_value: str | None
) -> list[tuple[str, Collection[NodeName]]]:
    """The domains (``groups``, of one key) to try, in order: the bound members' one first,
    then the tightest that has room. None when the level does not divide the feasible nodes (no
    node has the label, or one value covers them all: the whole-cluster try covers that)."""
    if not groups or (len(groups) == 1 and next(iter(groups.values())).count == len(search.union)):
        return []
    tightest = _tightest_first(groups, search.need)
    if bound_value is None or bound_value not in groups:
        return tightest
    first = groups[bound_value].nodes
    return [(bound_value, first)] + [(v, g) for v, g in tightest if v != bound_value]


@dataclass(frozen=True, slots=True)
class _Usable:
    """One domain as a search sees it: the free capacity and number of the nodes in it that
    some pod fits on, and ``nodes``, a set holding those (and perhaps others no pod fits on,
    which the assignment skips anyway)."""

    free: Resources
    count: int
    nodes: Collection[NodeName]


def _carried(search: _Search, key: str) -> bool:
    """Whether some node a pod fits on has the label ``key`` (none does when the snapshot's
    domains track ``key`` and have no value of it)."""
    index = search.domains.of(key) if search.domains is not None else None
    if index is not None and not index:
        return False
    nodes = search.nodes
    return any(key in nodes[n].node.labels for n in search.union)


def _usable(search: _Search, key: str) -> dict[str, _Usable]:
    """The domains of ``key`` that hold a node some pod fits on. From the snapshot's totals
    less the nodes no pod fits on when those are the fewer; else summed over the feasible
    nodes."""
    index = search.domains.of(key) if search.domains is not None else None
    if index is not None and not index:  # no node has the label
        return {}
    if index is not None and len(search.union) > len(search.nodes) - len(search.union):
        return _usable_from_totals(search, key, index)
    return _usable_summed(search.union, search.nodes, key)


def _usable_from_totals(
    search: _Search, key: str, index: Mapping[str, Domain]
) -> dict[str, _Usable]:
    if not search.outside:  # every node fits some pod: the totals as they are
        return {v: _Usable(d.free, len(d.members), d.members) for v, d in index.items()}
    free = {value: domain.free for value, domain in index.items()}
    count = {value: len(domain.members) for value, domain in index.items()}
    for name in search.outside:
        state = search.nodes[name]
        value = state.node.labels.get(key)
        if value is not None:
            free[value] = free[value] - state.free
            count[value] -= 1
    return {
        value: _Usable(free[value], count[value], domain.members)
        for value, domain in index.items()
        if count[value] > 0
    }


def _usable_summed(
    candidates: Iterable[NodeName], nodes: Mapping[NodeName, NodeState], key: str
) -> dict[str, _Usable]:
    groups: dict[str, set[NodeName]] = defaultdict(set)
    for name in candidates:
        value = nodes[name].node.labels.get(key)
        if value is not None:
            groups[value].add(name)
    usable: dict[str, _Usable] = {}
    for value, group in groups.items():
        cpu = memory = gpu = pods = 0
        for name in group:
            free = nodes[name].free
            cpu += free.cpu_milli
            memory += free.memory
            gpu += free.gpu
            pods += free.pods
        usable[value] = _Usable(Resources(cpu, memory, gpu, pods), len(group), group)
    return usable


def _tightest_first(
    groups: Mapping[str, _Usable], need: Resources
) -> list[tuple[str, Collection[NodeName]]]:
    """Domains whose free total covers ``need``, the one with the least room left first."""
    sized = [
        (domain.free.gpu - need.gpu, domain.free.cpu_milli, value, domain.nodes)
        for value, domain in groups.items()
        if domain.free.covers(need)
    ]
    sized.sort(key=lambda item: (item[0], item[1], item[2]))
    return [(value, group) for _, _, value, group in sized]


def _greedy(
    request: Request,
    pods: Sequence[PodRequest],
    *,
    feasible: Mapping[PodKey, Set[NodeName]],
    candidates: Collection[NodeName],
    nodes: Mapping[NodeName, NodeState],
    together_key: str | None,
    demand: Demand | None = None,
    spent: list[float] | None = None,
) -> tuple[Assignment, ...] | None:
    """Each pod in turn on the best-scoring candidate that still has room for it, the room
    taken before the next pod is placed; ``None`` as soon as one pod fits nowhere. With a
    ``together_key``, nodes in a value of it that already has members score higher."""
    stuck = _assign(
        request,
        pods,
        feasible=feasible,
        candidates=candidates,
        nodes=nodes,
        together_key=together_key,
        demand=demand,
        spent=spent,
    )
    return None if isinstance(stuck, _Stuck) else stuck


@dataclass(frozen=True, slots=True)
class _Stuck:
    """Where a greedy assignment stopped: ``pod`` fit no node, with ``placed`` pods placed
    before it and ``room`` what they left."""

    pod: PodRequest
    placed: int
    room: _Room


def _assign(
    request: Request,
    pods: Sequence[PodRequest],
    *,
    feasible: Mapping[PodKey, Set[NodeName]],
    candidates: Collection[NodeName],
    nodes: Mapping[NodeName, NodeState],
    together_key: str | None,
    demand: Demand | None = None,
    spent: list[float] | None = None,
) -> tuple[Assignment, ...] | _Stuck:
    """:func:`_greedy`, saying where it stopped when a pod fits nowhere; what each choice
    costs the likely pods is added to ``spent[0]``, when given (with a ``demand``)."""
    room = _Room(nodes)
    taken: dict[int, int] = {}  # per likely shape, its hosts the members placed so far took
    used: set[str] = set()
    if together_key is not None:
        for name in request.bound_nodes:
            if name in nodes and together_key in nodes[name].node.labels:
                used.add(nodes[name].node.labels[together_key])
    assignments: list[Assignment] = []
    for pod in pods:
        fits = feasible[pod.key]
        if len(candidates) < len(fits):
            candidates_for_pod = sorted(n for n in candidates if n in fits)
        else:
            candidates_for_pod = sorted(n for n in fits if n in candidates)
        best = _best_node(
            request,
            pod,
            names=candidates_for_pod,
            room=room,
            used=used,
            together_key=together_key,
            demand=demand,
        )
        if best is None:
            return _Stuck(pod, len(assignments), room)
        if spent is not None and demand is not None:
            spent[0] += demand.charge(demand.lost(pod.requests, room.on(best)[0]), taken)
        room.take(best, pod.requests)
        value = nodes[best].node.labels.get(together_key) if together_key is not None else None
        if value is not None:
            used.add(value)
        assignments.append(Assignment(pod.key, best))
    return tuple(assignments)


def _not_together(search: _Search, key: str | None) -> Unschedulable:
    """Why the pods, each of which fits some node, do not fit together anywhere: per node, why
    the first member left over does not fit once the members before it are placed (as
    kube-scheduler counts nodes for one pod)."""
    nodes = search.nodes
    stuck = _assign(
        search.request,
        search.pods,
        feasible=search.feasible,
        candidates=search.union,
        nodes=nodes,
        together_key=key,
        demand=search.demand,
    )
    total = len(search.pods)
    summary = f"the {total} member(s) do not fit together;"
    if not isinstance(stuck, _Stuck):  # cannot happen: the same search just failed
        return Unschedulable(len(nodes), summary=summary)
    reasons: Counter[str] = Counter()
    fits_alone = search.feasible[stuck.pod.key]
    for name, state in nodes.items():
        reason = (
            filters.resources_fit(stuck.pod.requests, stuck.room.on(name)[0])
            if name in fits_alone
            else filters.first_failure(stuck.pod, state)
        )
        reasons[reason or "no room left once the other members are placed"] += 1
    summary = f"only {stuck.placed} of the {total} member(s) fit at once;"
    return Unschedulable(len(nodes), dict(reasons), summary)


class _Room:
    """What is left on each node while one greedy assignment runs (read from the snapshot on
    first use, then reduced by every pod placed)."""

    __slots__ = ("free", "islands", "nodes")

    def __init__(self, nodes: Mapping[NodeName, NodeState]) -> None:
        self.nodes = nodes
        self.free: dict[NodeName, Resources] = {}
        self.islands: dict[NodeName, tuple[int, ...] | None] = {}

    def on(self, name: NodeName) -> tuple[Resources, tuple[int, ...] | None]:
        if name not in self.free:
            state = self.nodes[name]
            self.free[name] = state.free
            self.islands[name] = state.islands
        return self.free[name], self.islands[name]

    def take(self, name: NodeName, requests: Resources) -> None:
        """Charge ``requests`` to ``name``; its GPUs come out of its best island."""
        free, islands = self.on(name)
        left = free - requests
        if islands is not None:
            islands = topology.take(islands, requests.gpu)
            left = Resources(left.cpu_milli, left.memory, min(left.gpu, sum(islands)), left.pods)
        self.free[name] = left
        self.islands[name] = islands


def _best_node(
    request: Request,
    pod: PodRequest,
    *,
    names: Sequence[NodeName],
    room: _Room,
    used: set[str],
    together_key: str | None,
    demand: Demand | None = None,
) -> NodeName | None:
    """The highest-scoring of ``names`` with room left for ``pod``; ``None`` when none has.
    With a ``demand``, the score counts what the node costs the likely pods and how plentiful
    its shape is. Equal scores are told apart by a hash of pod and node name
    (:func:`tie_break`)."""
    requests = pod.requests
    best = 0.0
    best_name: NodeName | None = None
    best_tie: float | None = None  # the best node's tie_break, hashed only when a tie needs it
    # The score is a function of these, and many nodes share them (empty nodes of one shape):
    # each is scored once.
    scored: dict[tuple[object, ...], float] = {}
    for name in names:
        free, islands = room.on(name)
        if filters.resources_fit(requests, free) is not None:
            continue
        node = room.nodes[name].node
        value = node.labels.get(together_key) if together_key is not None else None
        together = value is not None and value in used
        key = (node.allocatable, node.spot, together, free, islands)
        known = scored.get(key)
        if known is not None:
            score = known
        else:
            score = scored[key] = node_score(
                requests,
                node,
                free,
                islands,
                surplus=request.surplus,
                together=together,
                weights=request.weights,
                fragment=demand.cost(requests, free) if demand is not None else 0.0,
                plenty=demand.plenty(node) if demand is not None else 0.0,
            )
        if best_name is None or score > best:
            best, best_name, best_tie = score, name, None
        elif score == best:
            if best_tie is None:
                best_tie = tie_break(pod.name, best_name)
            tie = tie_break(pod.name, name)
            if tie > best_tie:
                best_name, best_tie = name, tie
    return best_name


def tie_break(pod: str, node: str) -> float:
    """A tiny, stable amount (below 1e-6) that differs from node to node and from pod to pod, so
    that equal nodes are taken in no fixed order: by name, the first nodes would collect every
    small pod and run out of CPU beside free GPUs."""
    return zlib.crc32(f"{pod}\x00{node}".encode()) / 2**32 * 1e-6


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
