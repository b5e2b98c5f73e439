"""Capacity risk: revocation rates learned per pool, and quorums on the lowest-risk capacity."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from contracts import names
from scheduler.cycle import Config, decide_in_turn
from scheduler.gang import build_gangs
from scheduler.model import GangKey, Node, Placement, PodRequest, Taint, Unschedulable
from scheduler.placement import Request, place
from scheduler.placement import risk as riskmod
from scheduler.queue import GangQueue
from tests.unit.scheduler.builders import SCHED, node, pod, snapshot

REVOKING = Taint(names.REVOKING_TAINT, "aws", "NoSchedule")
HOUR = 3600.0


def pooled(name: str, kind: str, zone: str, **kw: Any) -> Node:
    labels = {riskmod.INSTANCE_TYPE_LABEL: kind}
    return node(name, zone=zone, spot=True, labels=labels, rack="r", **kw)


def revoked(n: Node) -> Node:
    return replace(n, taints=(REVOKING,))


A = ("p3.8xlarge", "zone-a", True)
B = ("g5.12xlarge", "zone-b", True)


def cluster() -> list[Node]:
    return [pooled(f"a{i}", A[0], A[1], gpus=4) for i in range(2)] + [
        pooled(f"b{i}", B[0], B[1], gpus=8) for i in range(2)
    ]


def test_a_revocation_is_counted_once_per_taint_and_raises_its_pools_rate() -> None:
    ledger = riskmod.RiskLedger()
    nodes = cluster()
    ledger.observe(nodes, 0.0)
    ledger.observe(nodes, 300.0)
    assert ledger.rate(A) == ledger.rate(B) == 0.0
    tainted = [revoked(nodes[0]), *nodes[1:]]
    assert ledger.observe(tainted, 400.0) == 1
    assert ledger.observe(tainted, 500.0) == 0  # still the same notice
    assert ledger.rate(A) > 0.0
    assert ledger.rate(B) == 0.0
    ledger.observe(nodes, 600.0)  # the taint is gone (the node came back) ...
    assert ledger.observe(tainted, 700.0) == 1  # ... and a new notice counts again
    assert ledger.counts[A].revocations == pytest.approx(2.0, rel=1e-3)


def test_exposure_counts_node_time_and_the_rate_is_the_gamma_poisson_mean() -> None:
    ledger = riskmod.RiskLedger(priors={A: 0.5}, prior_hours=10.0, window=1e12)
    nodes = cluster()
    for t in range(0, 11):
        ledger.observe(nodes, t * 360.0)  # 2 nodes of A for one hour
    assert ledger.counts[A].exposure == pytest.approx(2 * HOUR)
    assert ledger.rate(A) == pytest.approx(0.5 * 10 / 12)
    ledger.observe(nodes, 10 * 360.0 + 10 * riskmod.MAX_GAP)  # nobody watched that gap
    assert ledger.counts[A].exposure == pytest.approx(2 * HOUR, rel=1e-6)


def test_old_revocations_weigh_less_after_the_window() -> None:
    ledger = riskmod.RiskLedger(window=HOUR)
    nodes = cluster()
    ledger.observe([revoked(nodes[0]), *nodes[1:]], 0.0)
    ledger.observe(nodes, 2 * HOUR)
    assert ledger.counts[A].revocations == pytest.approx(math.exp(-2))


def test_the_counts_survive_a_restart_and_a_revoking_node_is_not_counted_again() -> None:
    ledger = riskmod.RiskLedger()
    nodes = cluster()
    tainted = [revoked(nodes[0]), *nodes[1:]]
    ledger.observe(nodes, 0.0)
    ledger.observe(tainted, 300.0)
    rate = ledger.rate(A)
    again = riskmod.RiskLedger()
    again.restore(ledger.document())
    assert again.rate(A) == pytest.approx(rate)
    assert again.observe(tainted, 400.0) == 0
    with pytest.raises(ValueError, match="version"):
        again.restore({"version": 99})


def test_the_operators_table_seeds_the_rates() -> None:
    table = riskmod.parse_seed(
        '[{"instanceType": "p3.8xlarge", "zone": "zone-a", "revocationsPerHour": 0.2},'
        ' {"instanceType": "m5", "zone": "z", "capacityType": "on-demand",'
        ' "revocationsPerHour": 0}]'
    )
    assert table == {A: 0.2, ("m5", "z", False): 0.0}
    assert riskmod.RiskLedger(priors=table).rate(A) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="entry 0"):
        riskmod.parse_seed('[{"zone": "z", "revocationsPerHour": -1}]')


def test_chance_of_falling_below_the_minimum() -> None:
    assert riskmod.chance_below([0.1, 0.2]) == pytest.approx(1 - math.exp(-0.3))
    one_spare = riskmod.chance_below([0.1, 0.2, 0.3], spare=1)
    assert 0 < one_spare < riskmod.chance_below([0.1, 0.2, 0.3])
    assert riskmod.chance_below([0.0, 0.0]) == 0.0


def test_the_bound_is_read_from_the_annotation() -> None:
    def with_bound(text: str) -> list[PodRequest]:
        return [pod("p", annotations={riskmod.MAX_QUORUM_RISK_ANNOTATION: text})]

    assert riskmod.quorum_bound(with_bound("5%")) == pytest.approx(0.05)
    assert riskmod.quorum_bound(with_bound("0.1")) == pytest.approx(0.1)
    assert "not a chance" in str(riskmod.quorum_bound(with_bound("low")))
    assert "between 0 and 1" in str(riskmod.quorum_bound(with_bound("2")))
    assert riskmod.quorum_bound([pod("p")]) is None


def request(pods: list[PodRequest], **kw: Any) -> Request:
    return Request(gang=GangKey("ns/g"), pods=pods, topology_keys=names.DEFAULT_TOPOLOGY_KEYS, **kw)


def where(result: Placement | Unschedulable) -> set[str]:
    assert isinstance(result, Placement), result
    return {a.node for a in result.assignments}


def test_the_quorum_goes_to_the_lowest_risk_capacity_and_surplus_may_take_the_riskier() -> None:
    # Pool A's 4-GPU nodes fit 4-GPU members exactly (the tight fit), pool B's 8-GPU ones do
    # not; pool A was revoked. The quorum goes to B; a surplus member takes A's tight fit.
    snap = snapshot(cluster())
    members = [pod(f"m{i}", gpus=4, gang="g") for i in range(2)]
    assert where(place(request(members), snap.nodes)) <= {"a0", "a1"}
    rates = {A: 0.5, B: 0.0}
    assert where(place(request(members, revocation=rates), snap.nodes)) <= {"b0", "b1"}
    surplus = request(members[:1], revocation=rates, surplus=True)
    assert where(place(surplus, snap.nodes)) <= {"a0", "a1"}
    # When the safe pool cannot hold the quorum, the riskier capacity is used.
    big = [pod(f"m{i}", gpus=4, gang="g") for i in range(6)]
    assert len(where(place(request(big, revocation=rates), snap.nodes))) >= 3


def test_a_bound_on_the_quorum_risk_keeps_the_gang_waiting_and_says_why() -> None:
    snap = snapshot([pooled(f"a{i}", A[0], A[1], gpus=4) for i in range(2)])
    members = [pod(f"m{i}", gpus=4, gang="g") for i in range(2)]
    held = place(request(members, revocation={A: 0.5}, max_quorum_risk=0.05), snap.nodes)
    assert isinstance(held, Unschedulable)
    assert "risks 63.2% of losing one within an hour, above the 5.0%" in held.message()
    assert riskmod.MAX_QUORUM_RISK_ANNOTATION in held.message()
    loose = place(request(members, revocation={A: 0.5}, max_quorum_risk=0.7), snap.nodes)
    assert isinstance(loose, Placement)


def test_the_cycle_learns_from_the_nodes_it_sees_and_places_the_quorum_by_it() -> None:
    ledger = riskmod.RiskLedger()
    config = Config(risk=ledger)
    nodes = cluster()
    tainted = [revoked(n) if n.name.startswith("a") else n for n in nodes]
    for now, seen in ((0.0, nodes), (60.0, tainted), (120.0, nodes)):
        list(decide_in_turn([], GangQueue(), snapshot(seen), now, config))
    assert ledger.rate(A) > ledger.rate(B)
    members = [pod(f"m{i}", gpus=4, gang="g", min_member="2") for i in range(2)]
    snap = snapshot(nodes, members)
    gangs, _ = build_gangs(snap.pods.values(), snap.pod_groups, SCHED)
    decisions = list(decide_in_turn(gangs, GangQueue(), snap, 180.0, config))
    assert {a.node for d in decisions for a in d.bindings} <= {"b0", "b1"}


def test_the_member_bound_is_read_from_its_own_annotation() -> None:
    notes = {riskmod.MAX_MEMBER_RISK_ANNOTATION: "5%"}
    assert riskmod.member_bound([pod("p", annotations=notes)]) == pytest.approx(0.05)
    assert riskmod.quorum_bound([pod("p", annotations=notes)]) is None
    assert riskmod.member_bound([pod("p")]) is None
    bad = {riskmod.MAX_MEMBER_RISK_ANNOTATION: "often"}
    assert "max-member-risk='often' is not a chance" in str(
        riskmod.member_bound([pod("p", annotations=bad)])
    )


def _surplus_decision(notes: dict[str, str]) -> Any:
    """A gang of two 4-GPU members (minimum 1) on a cluster of one on-demand node with room
    for one member and pool A's spot nodes, which were revoked: its decision."""
    ledger = riskmod.RiskLedger()
    config = Config(risk=ledger)
    spot = [pooled(f"a{i}", A[0], A[1], gpus=4) for i in range(2)]
    safe = node("od", gpus=4, zone="zone-a", rack="r")
    for now, seen in ((0.0, spot), (60.0, [revoked(n) for n in spot]), (120.0, spot)):
        list(decide_in_turn([], GangQueue(), snapshot([*seen, safe]), now, config))
    members = [
        pod(f"m{i}", gpus=4, gang="g", min_member="1", max_member="2", annotations=notes)
        for i in range(2)
    ]
    snap = snapshot([*spot, safe], members)
    gangs, _ = build_gangs(snap.pods.values(), snap.pod_groups, SCHED)
    (decision,) = decide_in_turn(gangs, GangQueue(), snap, 180.0, config)
    return decision


def test_a_bound_on_each_members_risk_keeps_surplus_members_off_risky_capacity() -> None:
    # Without the bound the quorum takes the safe node and the surplus member the revoked pool.
    free = _surplus_decision({})
    quorum, surplus = (a.node for a in free.bindings)
    assert quorum == "od"
    assert surplus in {"a0", "a1"}
    # With it, the surplus member waits for safe capacity, and its gang is told why.
    bound = _surplus_decision({riskmod.MAX_MEMBER_RISK_ANNOTATION: "5%"})
    assert [a.node for a in bound.bindings] == ["od"]
    why = bound.surplus_unschedulable
    assert why is not None
    assert "above the 5.0% shoal.dev/max-member-risk allows" in why.message()
    assert riskmod.MAX_QUORUM_RISK_ANNOTATION not in why.message()
