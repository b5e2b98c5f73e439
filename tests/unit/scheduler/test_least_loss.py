"""Least-loss reclaim and early warnings: which member goes, when, and what it is told."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from contracts import names
from contracts.progress import Progress, encode
from scheduler.cycle import Config, run_cycle
from scheduler.early_warning import revocation_warning, warning
from scheduler.gang import build_gangs
from scheduler.k8s import convert
from scheduler.loss import PATIENCE_ANNOTATION, ProgressCost, patience
from scheduler.model import Node, PodKey, PodRequest, Taint
from scheduler.placement.risk import MAX_MEMBER_RISK_ANNOTATION, RiskLedger
from scheduler.queue import GangQueue
from scheduler.settings import SettingsError, resolve
from scheduler.step import Ledgers, Step, StepSettings, step
from tests.unit.scheduler.builders import SCHED, node, pod, snapshot

NOW = 10_000.0


def progress(checkpoint_age: float, *, step_no: int = 1000, at: float = NOW) -> str:
    """A report made at ``at``: the last checkpoint ``checkpoint_age`` seconds of steps ago."""
    steps = int(checkpoint_age)  # one step per second
    return encode(
        Progress(
            step=step_no,
            step_seconds=1.0,
            checkpoint_step=step_no - steps,
            checkpoint_at=at - checkpoint_age,
            checkpoint_seconds=20.0,
            reported_at=at,
        )
    )


def member(
    name: str, node_name: str | None, *, report: str | None = None, created: float = 0.0, **kw: str
) -> PodRequest:
    notes = dict(kw)
    if report is not None:
        notes[names.PROGRESS_ANNOTATION] = report
    return pod(
        name,
        gpus=8,
        gang="e",
        min_member="1",
        max_member="4",
        node=node_name,
        created=created,
        annotations=notes,
    )


def waiting_gang(**notes: str) -> PodRequest:
    return pod("w0", gpus=8, gang="w", created=50.0, annotations=notes)


def victims_of(pods: list[PodRequest], nodes: int = 3) -> tuple[tuple[str, ...], dict[str, str]]:
    snap = snapshot([node(f"n{i}") for i in range(nodes)], pods)
    gangs, _ = build_gangs(snap.pods.values(), snap.pod_groups, SCHED)
    decision = run_cycle(gangs, GangQueue(), snap, NOW, Config())
    assert decision is not None
    return decision.victims, {k.split("/")[1]: v for k, v in decision.why.items()}


def test_the_member_with_the_newest_checkpoint_is_the_victim_among_equals() -> None:
    running = [
        member("e0", "n0", report=progress(900), created=1.0),
        member("e1", "n1", report=progress(30), created=2.0),  # newest checkpoint
        member("e2", "n2", report=progress(600), created=3.0),  # youngest
    ]
    victims, why = victims_of([*running, waiting_gang()])
    assert victims == (PodKey("ns/e1"),)
    assert "least expected loss" in why["e1"]
    assert "(30 s since its checkpoint at step 970" in why["e1"]
    assert "ns/e2" in why["e1"]  # the next candidate spared, and what it would lose


def test_without_reports_the_youngest_surplus_member_goes_as_before() -> None:
    running = [member(f"e{i}", f"n{i}", created=float(i)) for i in range(3)]
    victims, why = victims_of([*running, waiting_gang()])
    assert victims == (PodKey("ns/e2"),)
    assert "unknown loss" in why["e2"]


def test_an_unknown_loss_ranks_after_a_known_small_one_never_as_nothing() -> None:
    running = [
        member("e0", "n0", report=progress(900), created=1.0),
        member("e1", "n1", report=progress(10), created=2.0),
        member("e2", "n2", created=3.0),  # no report: the youngest, but its loss is unknown
    ]
    victims, _ = victims_of([*running, waiting_gang()])
    assert victims == (PodKey("ns/e1"),)


def test_a_report_that_cannot_be_read_is_an_unknown_loss() -> None:
    running = [
        member("e0", "n0", report="{not json", created=5.0),
        member("e1", "n1", report=progress(400), created=1.0),
        member("e2", "n2", report=progress(500), created=2.0),
    ]
    victims, _ = victims_of([*running, waiting_gang()])
    assert victims == (PodKey("ns/e1"),)


def test_the_cost_counts_gpus_and_the_restart() -> None:
    cost = ProgressCost(restart_seconds=60.0)
    loss = cost(member("e0", "n0", report=progress(100)), NOW + 20)
    assert loss.gpu_seconds == 8 * (100 + 20 + 60)  # the report's risk, the time since, restart
    assert cost(member("e1", "n0"), NOW).gpu_seconds is None


def test_patience_comes_from_the_pod_group_or_the_largest_member_annotation() -> None:
    snap = snapshot([node("n0")], [waiting_gang(**{PATIENCE_ANNOTATION: "120"})])
    gangs, _ = build_gangs(snap.pods.values(), snap.pod_groups, SCHED)
    assert patience(gangs[0], snap.pod_groups) == 120.0
    bad = snapshot([node("n0")], [waiting_gang(**{PATIENCE_ANNOTATION: "soon"})])
    gangs, _ = build_gangs(bad.pods.values(), bad.pod_groups, SCHED)
    assert patience(gangs[0], bad.pod_groups) == 0.0


# -- the step: patience and early warnings ------------------------------------------------------


def run(
    ledgers: Ledgers, pods: list[PodRequest], now: float, nodes: list[Node] | None = None
) -> Step:
    snap = snapshot(nodes or [node(f"n{i}") for i in range(3)], pods)
    gangs, _ = build_gangs(snap.pods.values(), snap.pod_groups, SCHED)
    return step(ledgers, gangs, snap, now)


def asked_now(this: Step) -> dict[str, tuple[float, str]]:
    """Every pod asked to leave by this step: its leave-by and why."""
    out = {
        p.name: (ask.leave_by, ask.why.get(p.key, ""))
        for ask in this.opening.asks
        for p in ask.asked
    }
    for outcome in this.outcomes:
        for p in outcome.asked:
            assert outcome.leave_by is not None
            out[p.name] = (outcome.leave_by, outcome.why.get(p.key, ""))
    return out


def test_a_patient_reclaim_waits_for_the_victims_next_checkpoint() -> None:
    ledgers = Ledgers(StepSettings(reclaim_grace=30.0))
    running = [
        member("e0", "n0", report=progress(900), created=1.0),
        member("e1", "n1", report=progress(300), created=2.0),
        member("e2", "n2", report=progress(600), created=3.0),
    ]
    wanted = waiting_gang(**{PATIENCE_ANNOTATION: "300"})
    assert asked_now(run(ledgers, [*running, wanted], NOW)) == {}  # chosen, not asked yet
    assert ledgers.reclaims.spent() == {PodKey("ns/e1"): "ns/w"}
    later = run(ledgers, [*running, wanted], NOW + 60)
    assert not later.opening.asks  # no new checkpoint yet
    outcomes = list(later.outcomes)
    assert [o.asked for o in outcomes] == [()]
    told = outcomes[0].unplaced
    assert told is not None
    assert told.message.startswith("Reclaim waits for the next checkpoint of 1 member(s)")
    # e1 reports a new checkpoint: it is asked now, and told why.
    running[1] = member("e1", "n1", report=progress(0, step_no=1100, at=NOW + 90), created=2.0)
    asked = asked_now(run(ledgers, [*running, wanted], NOW + 90))
    assert list(asked) == ["e1"]
    leave_by, why = asked["e1"]
    assert leave_by == NOW + 90 + 30
    assert "asked at its new checkpoint (step 1100)" in why


def test_a_patient_reclaim_proceeds_when_the_patience_runs_out() -> None:
    ledgers = Ledgers(StepSettings(reclaim_grace=30.0))
    running = [member(f"e{i}", f"n{i}", report=progress(100 * (i + 1))) for i in range(3)]
    wanted = waiting_gang(**{PATIENCE_ANNOTATION: "300"})
    assert asked_now(run(ledgers, [*running, wanted], NOW)) == {}
    assert ledgers.next_due() == NOW + 300  # the loop wakes when the patience ends
    assert asked_now(run(ledgers, [*running, wanted], NOW + 299)) == {}
    asked = asked_now(run(ledgers, [*running, wanted], NOW + 300))
    assert list(asked) == ["e0"]
    assert "no new checkpoint by" in asked["e0"][1]


def test_a_patient_reclaim_asks_a_victim_without_a_report_at_once() -> None:
    ledgers = Ledgers(StepSettings(reclaim_grace=30.0))
    running = [member(f"e{i}", f"n{i}", created=float(i)) for i in range(3)]
    wanted = waiting_gang(**{PATIENCE_ANNOTATION: "300"})
    asked = asked_now(run(ledgers, [*running, wanted], NOW))
    assert list(asked) == ["e2"]
    assert asked["e2"][0] == NOW + 30


def warned_nodes(how: str) -> list[Node]:
    taints = (Taint("karpenter.sh/disrupted", "", "NoSchedule"),) if how == "taint" else ()
    return [
        node("n0", taints=taints, unschedulable=how == "cordon"),
        node("n1"),
        node("n2"),
    ]


def test_a_cordon_moves_the_surplus_member_at_its_next_checkpoint() -> None:
    ledgers = Ledgers(StepSettings(reclaim_grace=30.0, early_warning_wait=600.0))
    running = [
        member("e0", "n0", report=progress(100), created=1.0),
        member("e1", "n1", report=progress(100), created=2.0),
    ]
    nodes = warned_nodes("cordon")
    assert asked_now(run(ledgers, running, NOW, nodes)) == {}  # waits for the checkpoint
    assert ledgers.reclaims.spent() == {PodKey("ns/e0"): "ns/e"}  # only the warned node's
    running[0] = member("e0", "n0", report=progress(0, step_no=1200, at=NOW + 40), created=1.0)
    asked = asked_now(run(ledgers, running, NOW + 40, nodes))
    assert list(asked) == ["e0"]
    assert "node n0 is expected to go (cordoned)" in asked["e0"][1]


def test_a_disruption_taint_moves_a_member_without_a_report_at_once() -> None:
    ledgers = Ledgers(StepSettings(reclaim_grace=30.0))
    running = [member("e0", "n0", created=1.0), member("e1", "n1", created=2.0)]
    asked = asked_now(run(ledgers, running, NOW, warned_nodes("taint")))
    assert list(asked) == ["e0"]
    assert "taint karpenter.sh/disrupted" in asked["e0"][1]
    assert "asked at once" in asked["e0"][1]


def test_a_warned_node_never_takes_a_gang_below_its_minimum() -> None:
    ledgers = Ledgers(StepSettings())
    running = [
        pod("e0", gpus=8, gang="e", min_member="2", max_member="4", node="n0"),
        pod("e1", gpus=8, gang="e", min_member="2", max_member="4", node="n1"),
    ]
    assert asked_now(run(ledgers, running, NOW, warned_nodes("cordon"))) == {}
    assert ledgers.reclaims.spent() == {}


def test_a_withdrawn_warning_cancels_the_wait_and_a_pod_the_agent_told_is_left_to_it() -> None:
    ledgers = Ledgers(StepSettings())
    running = [
        member("e0", "n0", report=progress(100), created=1.0),
        member("e1", "n1", report=progress(100), created=2.0),
    ]
    run(ledgers, running, NOW, warned_nodes("cordon"))
    assert ledgers.reclaims.spent()
    run(ledgers, running, NOW + 1, warned_nodes("none"))
    assert ledgers.reclaims.spent() == {}
    told = {names.LEAVE_BY_ANNOTATION: "2026-12-02T10:00:00Z"}
    running[0] = member("e0", "n0", created=1.0, **told)
    assert asked_now(run(ledgers, running, NOW + 2, warned_nodes("cordon"))) == {}


def test_only_non_disruptive_revocation_notices_are_early_warnings() -> None:
    def doc(*notices: tuple[str, bool]) -> str:
        return json.dumps(
            {
                "notices": [
                    {"kind": kind, "reason": f"{kind} reason", "disruptive": disruptive}
                    for kind, disruptive in notices
                ]
            }
        )

    assert revocation_warning(doc(("rebalance", False))) == "rebalance: rebalance reason"
    assert revocation_warning(doc(("rebalance", False), ("terminate", True))) == ""
    assert revocation_warning("{") == ""
    assert revocation_warning(None) == ""
    n = node("n0")
    assert warning(n) == ""
    assert warning(node("n0", unschedulable=True)) == "cordoned"
    assert warning(None) == ""


def test_a_priority_class_may_give_patience_when_the_gang_sets_none() -> None:
    ledgers = Ledgers(StepSettings(reclaim_grace=30.0, class_patience={"high": 300.0}))
    running = [member(f"e{i}", f"n{i}", report=progress(100 * (i + 1))) for i in range(3)]
    wanted = replace(waiting_gang(), priority_class="high")
    assert asked_now(run(ledgers, [*running, wanted], NOW)) == {}  # waits
    assert ledgers.reclaims.spent() == {PodKey("ns/e0"): "ns/w"}
    own = waiting_gang(**{PATIENCE_ANNOTATION: "0"})  # the gang's own word comes first
    other = Ledgers(StepSettings(class_patience={"high": 300.0}))
    assert list(asked_now(run(other, [*running, replace(own, priority_class="high")], NOW))) == [
        "e0"
    ]


def test_the_settings_and_the_api_objects_carry_what_the_rules_read() -> None:
    cli = resolve(["--reclaim-patience", "high=300, low=0"], env={})
    assert cli.reclaim_patience == (("high", 300.0), ("low", 0.0))
    with pytest.raises(SettingsError, match="reclaim-patience"):
        resolve(["--reclaim-patience", "high=forever"], env={})
    raw_pod = {
        "metadata": {"name": "a", "namespace": "ns"},
        "spec": {"priorityClassName": "high"},
    }
    assert convert.pod(raw_pod).priority_class == "high"
    rebalance = {"notices": [{"kind": "rebalance", "reason": "EC2 rebalance", "disruptive": False}]}
    raw_node = {
        "metadata": {
            "name": "n0",
            "annotations": {names.REVOCATION_ANNOTATION: json.dumps(rebalance)},
        }
    }
    assert warning(convert.node(raw_node)) == "rebalance: EC2 rebalance"


def test_lower_priority_gangs_are_taken_whole_least_total_loss_first() -> None:
    def low(gang: str, at: str, age: float) -> PodRequest:
        return pod(
            f"{gang}0",
            gpus=8,
            gang=gang,
            min_member="1",
            node=at,
            created=1.0 if gang == "old" else 2.0,
            annotations={names.PROGRESS_ANNOTATION: progress(age)},
        )

    urgent = pod("u0", gpus=8, gang="u", created=50.0, priority=10)
    victims, why = victims_of([low("old", "n0", 20), low("young", "n1", 700), urgent], nodes=2)
    assert victims == (PodKey("ns/old0"),)  # the youngest gang would go without reports
    assert "whole gang 1 of 2" in why["old0"]
    assert "GPU-seconds in all" in why["old0"]


def test_a_member_whose_replacement_has_nowhere_to_go_stays() -> None:
    ledgers = Ledgers(StepSettings())
    running = [member("e0", "n0", created=1.0), member("e1", "n1", created=2.0)]
    two_nodes = warned_nodes("cordon")[:2]  # n0 cordoned, n1 full: no room for a replacement
    assert asked_now(run(ledgers, running, NOW, two_nodes)) == {}
    assert ledgers.reclaims.spent() == {}
    assert list(asked_now(run(ledgers, running, NOW + 1, warned_nodes("cordon")))) == ["e0"]


def test_a_replacement_keeps_the_gangs_bound_on_each_members_risk() -> None:
    risky_spot = ("", "zone-a", True)  # one revocation an hour: 63% within the hour
    ledgers = Ledgers(StepSettings(config=Config(risk=RiskLedger(priors={risky_spot: 1.0}))))
    bound = {MAX_MEMBER_RISK_ANNOTATION: "0.05"}
    running = [
        member("e0", "n0", created=1.0, **bound),
        member("e1", "n1", created=2.0, **bound),
    ]
    nodes = [node("n0", unschedulable=True), node("n1"), node("n2", spot=True)]
    # The only room elsewhere is riskier than the gang allows: e0 stays on its cordoned node.
    assert asked_now(run(ledgers, running, NOW, nodes)) == {}
    assert ledgers.reclaims.spent() == {}
    nodes.append(node("n3"))  # room on safe capacity
    assert list(asked_now(run(ledgers, running, NOW + 1, nodes))) == ["e0"]
