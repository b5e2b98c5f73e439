"""The pod shapes that arrive, learned as they come: what a placement expects next. Pure.

:mod:`scheduler.placement.demand` charges a placement for what it takes from the pods likely to
come. Without more, those are read from the node shapes (a share of each node). The pods that
actually arrive say more: a workload whose 1-GPU pods ask 18 CPUs needs that much CPU left
beside a free GPU, which no share of a 96-CPU, 8-GPU node shows. :class:`ShapeLedger` counts
each gang's pods as they are asked for, per shape (CPU, memory, GPUs) and per size of the gang
(the GPUs its members ask together), every count decaying with a half-life, so that a shift in
the workload is followed within hours. :meth:`ShapeLedger.likely` hands the placement the
shapes that came most (:class:`Likely`, a plain value on the ``Request``).

``now`` is always passed in; the ledger is one object the scheduling loop (or a benchmark) owns
and calls from one thread. The live loop and the simulator hold it in
:attr:`scheduler.cycle.Config.shapes` (``--arrived-shapes``; the simulator's Shoal policy), and
:func:`scheduler.cycle.decide_in_turn`, which both run in every step, hands it the step's gangs
(:meth:`ShapeLedger.arrived`) and every placement it asks for the ledger's view.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from scheduler.model import Gang, GangKey, Resources

_K = TypeVar("_K")

#: A pod shape: CPU (millicores), memory (bytes), GPUs.
Shape = tuple[int, int, int]

#: How many GPU pod shapes :meth:`ShapeLedger.likely` hands over (the most frequent): each is a
#: bit the placement tracks on every node, so their number is its cost.
LIKELY_SHAPES: Final = 12
#: How many entries the ledger keeps (the lightest go first beyond it).
_KEEP: Final = 256
#: Weights are kept relative to a reference time and rescaled before they overflow.
_RESCALE: Final = 500.0


@dataclass(frozen=True, slots=True)
class Likely:
    """What the arriving pods say about the next ones.

    ``shapes``: the GPU pod shapes seen most often, the most frequent first, each with its
    share of the pods of those shapes (summing to 1). ``gangs``: how many GPUs a gang asks for
    in all, and the share of the gangs seen that asked that many (summing to 1). Empty when
    nothing was seen.
    """

    shapes: tuple[tuple[Shape, float], ...] = ()
    gangs: tuple[tuple[int, float], ...] = ()

    def unusable(self, gpus: int) -> bool:
        """Whether ``gpus`` left free in a domain are too few for every gang seen (true when
        none was seen): then no gang that comes could use them."""
        return all(size > gpus for size, _ in self.gangs)


class ShapeLedger:
    """Pods asked for, per shape and per gang size, decaying with ``half_life`` seconds."""

    def __init__(self, *, half_life: float = 3600.0, limit: int = LIKELY_SHAPES) -> None:
        self.half_life = half_life
        self.limit = limit
        #: Weights relative to ``_origin``: a count made at ``t`` weighs 2**((t - origin) / h).
        self._pods: dict[Shape, float] = {}
        self._gangs: dict[int, float] = {}
        self._origin: float | None = None
        self._likely: Likely | None = Likely()
        #: What :meth:`arrived` has counted and still sees: pods (by uid) and gangs.
        self._seen_pods: set[str] = set()
        self._seen_gangs: set[GangKey] = set()

    def observe(self, pods: Sequence[Resources], now: float) -> None:
        """Count one gang (or lone pod) asking for ``pods`` at ``now``."""
        self._count(pods, sum(requests.gpu for requests in pods), now)

    def arrived(self, gangs: Iterable[Gang], now: float) -> None:
        """Count what is new among ``gangs`` (one step's, built from its snapshot) at ``now``:
        each member once (by uid), and each gang once, as soon as every member of its minimum
        exists, by the GPUs its first ``min_member`` members ask together (what one placement
        is asked for at once). Members and gangs gone are forgotten, so a pod that waits through
        many steps counts once; on the first call, what already runs counts too (a restarted
        scheduler starts from the workload as it stands)."""
        pods: set[str] = set()
        keys: set[GangKey] = set()
        for gang in gangs:
            fresh: list[Resources] = []
            for pod in gang.members:
                uid = pod.uid or pod.key
                pods.add(uid)
                if uid not in self._seen_pods:
                    fresh.append(pod.requests)
            size = 0
            if gang.key in self._seen_gangs:
                keys.add(gang.key)
            elif len(gang.members) >= gang.min_member:
                keys.add(gang.key)
                size = sum(p.requests.gpu for p in gang.members[: max(1, gang.min_member)])
            if fresh or size:
                self._count(fresh, size, now)
        self._seen_pods = pods
        self._seen_gangs = keys

    def _count(self, pods: Sequence[Resources], gang: int, now: float) -> None:
        """Count ``pods`` by shape, and a gang asking ``gang`` GPUs in all (none when 0)."""
        if not pods and gang <= 0:
            return
        scale = self._scale(now)
        for requests in pods:
            if requests.gpu > 0:
                shape = (requests.cpu_milli, requests.memory, requests.gpu)
                self._pods[shape] = self._pods.get(shape, 0.0) + scale
        if gang > 0:
            self._gangs[gang] = self._gangs.get(gang, 0.0) + scale
        _trim(self._pods)
        _trim(self._gangs)
        self._likely = None

    def likely(self) -> Likely:
        """The :data:`LIKELY_SHAPES` most frequent GPU pod shapes and the gang sizes, as shares
        (decay weighs every count alike at a given time, so the shares need no ``now``)."""
        if self._likely is None:
            top = heapq.nsmallest(
                self.limit, self._pods.items(), key=lambda item: (-item[1], item[0])
            )
            whole = sum(weight for _, weight in top)
            gangs = sum(self._gangs.values())
            self._likely = Likely(
                tuple((shape, weight / whole) for shape, weight in top) if whole > 0 else (),
                tuple(sorted((size, w / gangs) for size, w in self._gangs.items()))
                if gangs > 0
                else (),
            )
        return self._likely

    def _scale(self, now: float) -> float:
        """The weight of a count made at ``now``, relative to the origin (rescaling every
        weight first when it grows too large)."""
        if self._origin is None:
            self._origin = now
        exponent = (now - self._origin) / self.half_life if self.half_life > 0 else 0.0
        if exponent > _RESCALE:
            shrink = math.pow(2.0, -exponent)
            _shrink(self._pods, shrink)
            _shrink(self._gangs, shrink)
            self._origin, exponent = now, 0.0
        return math.pow(2.0, max(exponent, -_RESCALE))


def _shrink(table: dict[_K, float], factor: float) -> None:
    for key in table:
        table[key] *= factor


def _trim(table: dict[_K, float]) -> None:
    """Beyond :data:`_KEEP` entries, keep the heaviest three quarters of that."""
    if len(table) > _KEEP:
        keep = heapq.nlargest(_KEEP * 3 // 4, table.items(), key=lambda item: item[1])
        table.clear()
        table.update(keep)
