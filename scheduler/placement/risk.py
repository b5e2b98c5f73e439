"""Capacity risk: how often each capacity pool is revoked, and what that risks for a quorum. Pure.

A *pool* is the capacity one kind of node comes from: its instance type
(``node.kubernetes.io/instance-type``), its zone (``topology.kubernetes.io/zone``) and whether it
is spot. Its revocation rate (revocations per node-hour) is learned from what the agents did:
an agent that hears a notice taints its node ``shoal.dev/revoking`` (``contracts.names``), and
the scheduler sees the node update. :class:`RiskLedger` counts each node once per time it gains
that taint, and counts every node's time in its pool (its *exposure*), both decaying with a
window (``window`` seconds: what happened a window ago weighs ``1/e``), so that a pool that was
revoked often a month ago and not since is trusted again. The estimate is the Gamma-Poisson
mean: ``(prior * prior_hours + revocations) / (prior_hours + exposure hours)``, where ``prior``
is the operator's rate for the pool (a seed table, :func:`parse_seed`), or 0.

The ledger's counts are a document (:meth:`RiskLedger.document`, :meth:`RiskLedger.restore`)
that the scheduler keeps in the cluster, so that a restarted or new leader starts from them.

Placement (:mod:`scheduler.placement.search`) puts a gang's quorum on the lowest-risk capacity
that holds it; surplus members may take any. :func:`chance_below` is the chance that more than
``spare`` of some members are revoked within ``hours``, each independently at its pool's rate;
for a quorum (spare 0) it is ``1 - exp(-sum of rates * hours)``. A gang may bound it
(``shoal.dev/max-quorum-risk``, :func:`quorum_bound`).

A gang may also bound the risk of each surplus member (``shoal.dev/max-member-risk``,
:func:`member_bound`): a synchronous gang whose checkpoint takes longer than a notice loses its
work since the last checkpoint whenever *any* member is revoked, surplus or not, so a surplus
member on risky capacity costs it more than the member adds. With the bound, each surplus
member goes to the lowest-risk capacity that holds it, and waits rather than take a node whose
chance of being revoked within an hour is above the bound (:mod:`scheduler.cycle`).

``now`` is always passed in; the ledger is one object the scheduling loop (or the simulator)
owns and calls from one thread.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from contracts import names
from scheduler.model import Node, NodeName, NodeState, PodRequest

INSTANCE_TYPE_LABEL: Final = "node.kubernetes.io/instance-type"
#: The gang's bound on the chance of falling below its minimum within an hour (0-1, or "5%").
MAX_QUORUM_RISK_ANNOTATION: Final = "shoal.dev/max-quorum-risk"
#: The gang's bound on the chance of losing each surplus member within an hour (0-1, or "5%").
MAX_MEMBER_RISK_ANNOTATION: Final = "shoal.dev/max-member-risk"

#: (instance type, zone, spot): "" where a node lacks the label.
Pool = tuple[str, str, bool]

#: Gaps between observations longer than this are not counted as exposure (the scheduler was
#: down, or not leading: nobody saw what happened meanwhile).
MAX_GAP: Final = 600.0
DOCUMENT_VERSION: Final = 1


def pool_of(node: Node) -> Pool:
    labels = node.labels
    return (labels.get(INSTANCE_TYPE_LABEL, ""), labels.get(names.ZONE_LABEL, ""), node.spot)


def revoking(node: Node) -> bool:
    return any(t.key == names.REVOKING_TAINT for t in node.taints)


def pool_name(pool: Pool) -> str:
    kind, zone, spot = pool
    return f"{kind or '?'}/{zone or '?'}/{'spot' if spot else 'on-demand'}"


@dataclass(slots=True)
class Count:
    """One pool's decayed revocations and exposure (node-seconds)."""

    revocations: float = 0.0
    exposure: float = 0.0


class RiskLedger:
    """Revocations and exposure per pool, learned from the nodes as they are seen."""

    def __init__(
        self,
        *,
        priors: Mapping[Pool, float] | None = None,
        prior_hours: float = 24.0,
        window: float = 7 * 24 * 3600.0,
    ) -> None:
        self.priors: dict[Pool, float] = dict(priors or {})
        self.prior_hours = prior_hours
        self.window = window
        self.counts: dict[Pool, Count] = {}
        #: Nodes counted as revoked, while they carry the taint.
        self.revoked: set[NodeName] = set()
        self.last: float | None = None
        #: Bumped whenever a revocation is counted (the writer saves at least then).
        self.changes = 0
        self._seen: dict[NodeName, tuple[Node, Pool]] = {}
        self._sizes: dict[Pool, int] = {}
        self._rates: dict[Pool, float] | None = None

    # -- learning ---------------------------------------------------------------------------------
    def observe(self, nodes: Mapping[NodeName, NodeState] | Iterable[Node], now: float) -> int:
        """Bring the counts up to ``now`` with the cluster's ``nodes`` as they are; returns how
        many revocations were newly counted."""
        current = _nodes(nodes)
        self._age(now)
        self._refresh(current)
        fresh = 0
        for name, (node, pool) in self._seen.items():
            if revoking(node):
                if name not in self.revoked:
                    self.revoked.add(name)
                    self.counts.setdefault(pool, Count()).revocations += 1.0
                    fresh += 1
            elif name in self.revoked:
                self.revoked.discard(name)
        self.revoked &= self._seen.keys()
        if fresh:
            self.changes += 1
            self._rates = None
        return fresh

    def _age(self, now: float) -> None:
        last, self.last = self.last, now
        if last is None or now <= last:
            return
        gap = now - last
        keep = math.exp(-gap / self.window) if self.window > 0 else 1.0
        for count in self.counts.values():
            count.revocations *= keep
            count.exposure *= keep
        if gap <= MAX_GAP:
            for pool, size in self._sizes.items():
                self.counts.setdefault(pool, Count()).exposure += size * gap
        self._rates = None

    def _refresh(self, current: Mapping[NodeName, Node]) -> None:
        seen = self._seen
        changed = len(seen) != len(current)
        for name, node in current.items():
            old = seen.get(name)
            if old is None or old[0] is not node:
                seen[name] = (node, pool_of(node))
                changed = True
        if changed:
            for name in [n for n in seen if n not in current]:
                del seen[name]
            sizes: dict[Pool, int] = {}
            for _, pool in seen.values():
                sizes[pool] = sizes.get(pool, 0) + 1
            self._sizes = sizes

    def worth_keeping(self) -> bool:
        """Whether the counts say more than "nothing is known": a revocation was counted (and
        has not decayed away), or the operator gave rates the exposure refines."""
        return bool(self.priors) or any(c.revocations > 1e-6 for c in self.counts.values())

    # -- estimates --------------------------------------------------------------------------------
    def rate(self, pool: Pool) -> float:
        """Revocations per node-hour expected of ``pool``."""
        count = self.counts.get(pool)
        prior = self.priors.get(pool, 0.0)
        revocations = count.revocations if count else 0.0
        hours = count.exposure / 3600.0 if count else 0.0
        if self.prior_hours + hours <= 0:
            return prior
        return (prior * self.prior_hours + revocations) / (self.prior_hours + hours)

    def rates(self) -> Mapping[Pool, float]:
        """Every known pool's rate (pools seen, counted or seeded); cached until counts change."""
        if self._rates is None:
            pools = set(self.priors) | set(self.counts) | set(self._sizes)
            self._rates = {pool: self.rate(pool) for pool in pools}
        return self._rates

    # -- the document kept in the cluster ---------------------------------------------------------
    def document(self) -> dict[str, Any]:
        """The counts as a JSON-able document (see :meth:`restore`)."""
        return {
            "version": DOCUMENT_VERSION,
            "updated": self.last,
            "windowSeconds": self.window,
            "pools": [
                {
                    "instanceType": pool[0],
                    "zone": pool[1],
                    "capacityType": "spot" if pool[2] else "on-demand",
                    "revocations": round(count.revocations, 6),
                    "exposureSeconds": round(count.exposure, 3),
                    "ratePerHour": round(self.rate(pool), 6),
                }
                for pool, count in sorted(list(self.counts.items()))
            ],
            "revoking": sorted(self.revoked),
        }

    def restore(self, document: Mapping[str, Any]) -> None:
        """Take the counts of a :meth:`document` (from an earlier leader); raises ``ValueError``
        on a document that is not one."""
        if document.get("version") != DOCUMENT_VERSION:
            raise ValueError(f"unknown version {document.get('version')!r}")
        counts: dict[Pool, Count] = {}
        for row in document.get("pools") or []:
            pool = _pool_of_row(row)
            counts[pool] = Count(float(row["revocations"]), float(row["exposureSeconds"]))
        updated = document.get("updated")
        self.counts = counts
        self.last = float(updated) if updated is not None else None
        self.revoked = {NodeName(str(n)) for n in document.get("revoking") or []}
        self._rates = None


def _nodes(nodes: Mapping[NodeName, NodeState] | Iterable[Node]) -> dict[NodeName, Node]:
    if isinstance(nodes, Mapping):
        return {name: state.node for name, state in nodes.items()}
    return {node.name: node for node in nodes}


def _pool_of_row(row: Mapping[str, Any]) -> Pool:
    capacity = str(row.get("capacityType", "spot")).lower()
    if capacity not in {"spot", "on-demand"}:
        raise ValueError(f"capacityType must be spot or on-demand, got {capacity!r}")
    return (str(row.get("instanceType", "")), str(row.get("zone", "")), capacity == "spot")


def parse_seed(text: str) -> dict[Pool, float]:
    """The operator's table of revocation rates: JSON or YAML-like JSON, a list of
    ``{"instanceType", "zone", "capacityType" (spot, the default, or on-demand),
    "revocationsPerHour"}``. Raises ``ValueError`` naming the bad entry."""
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    return seed_rows(rows)


def seed_rows(rows: object) -> dict[Pool, float]:
    """:func:`parse_seed` on rows already read (from YAML, for example)."""
    if not isinstance(rows, list):
        raise ValueError("expected a list of pools")
    table: dict[Pool, float] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"entry {i}: expected a mapping")
        try:
            rate = float(row["revocationsPerHour"])
            pool = _pool_of_row(row)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"entry {i}: {exc}") from exc
        if not math.isfinite(rate) or rate < 0:
            raise ValueError(f"entry {i}: revocationsPerHour must be >= 0, got {rate}")
        table[pool] = rate
    return table


# -- what a placement risks ---------------------------------------------------------------------
def chance_below(rates: Sequence[float], spare: int = 0, hours: float = 1.0) -> float:
    """The chance that more than ``spare`` of members on nodes revoked at ``rates`` (per hour)
    are revoked within ``hours``, each independently (a Poisson process per node)."""
    if spare < 0:
        return 1.0
    # dist[k]: the chance that exactly k members (k <= spare) are revoked so far.
    dist = [1.0] + [0.0] * spare
    for rate in rates:
        p = 1.0 - math.exp(-max(rate, 0.0) * hours)
        for k in range(spare, 0, -1):
            dist[k] = dist[k] * (1.0 - p) + dist[k - 1] * p
        dist[0] *= 1.0 - p
    return max(0.0, 1.0 - sum(dist))


def quorum_bound(pods: Iterable[PodRequest]) -> float | str | None:
    """The gang's ``shoal.dev/max-quorum-risk`` (the first member that carries it): a chance
    from 0 to 1 (``0.05`` or ``5%``); ``None`` when absent; the reason, as a string, when it
    is not a chance."""
    return _bound(pods, MAX_QUORUM_RISK_ANNOTATION)


def member_bound(pods: Iterable[PodRequest]) -> float | str | None:
    """The gang's ``shoal.dev/max-member-risk``, read as :func:`quorum_bound` reads its own."""
    return _bound(pods, MAX_MEMBER_RISK_ANNOTATION)


def member_summary(summary: str) -> str:
    """A placement's reason for waiting (worded for the quorum's bound by the search) as it
    reads for a surplus member held back by :data:`MAX_MEMBER_RISK_ANNOTATION`."""
    return summary.replace(MAX_QUORUM_RISK_ANNOTATION, MAX_MEMBER_RISK_ANNOTATION)


def _bound(pods: Iterable[PodRequest], annotation: str) -> float | str | None:
    for pod in pods:
        text = pod.annotations.get(annotation)
        if text is None:
            continue
        text = text.strip()
        try:
            value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            return f"{annotation}={text!r} is not a chance (0.05 or 5%)"
        if not 0.0 <= value <= 1.0 or not math.isfinite(value):
            return f"{annotation}={text!r} is not between 0 and 1 (0%-100%)"
        return value
    return None
