"""Shoal under Kueue (docs/kueue.md): a Kueue pod group is one gang of its total count; a pod
that also names another gang waits, saying so; a gated pod is never bound, so a gang binds
only once Kueue has admitted (ungated) every member it needs, and never beyond what Kueue
admitted; the node selectors Kueue injects at admission (a ResourceFlavor's node labels, a
topology assignment) keep every member where Kueue said it may go. Pods are read from the API's
JSON, as the informer reads them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from contracts import names
from scheduler.cache import Cache, Snapshot
from scheduler.cycle import Config, Decision, run_cycle
from scheduler.gang import build_gangs
from scheduler.gang.sources import NAMED, claim
from scheduler.gang.sources.kueue import (
    ADMISSION_GATE,
    ELASTIC_JOB_GATE,
    FAST_ADMISSION,
    GROUP_NAME,
    TOPOLOGY_GATE,
    TOTAL_COUNT,
    KueuePodGroup,
)
from scheduler.k8s import convert
from scheduler.k8s.view import ClusterView
from scheduler.model import Gang, Node, PodRequest, Taint
from scheduler.placement import filters
from scheduler.queue import GangQueue
from tests.unit.scheduler.builders import SCHED, group, node, snapshot

#: A ResourceFlavor's node labels and taint, as Kueue injects them into an admitted pod.
FLAVOR = {"cloud.example.com/accelerator": "h100"}
FLAVOR_TAINT = Taint("cloud.example.com/reserved", "ml", "NoSchedule")
SERVING = "kueue.x-k8s.io/pod-group-serving"


def raw_pod(
    name: str,
    *,
    group: str | None = "train",
    total: str | None = "4",
    gates: Sequence[str] = (),
    gpus: int = 4,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, str]] = (),
    node: str | None = None,
    created: int = 0,
) -> dict[str, Any]:
    """A pod as the API serves it once Kueue's webhook has seen it."""
    all_labels = {"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/managed": "true"}
    all_labels |= labels or {}
    notes = dict(annotations or {})
    if group is not None:
        all_labels[GROUP_NAME] = group
    if total is not None:
        notes[TOTAL_COUNT] = total
    spec: dict[str, Any] = {
        "schedulerName": SCHED,
        "containers": [{"name": "w", "resources": {"limits": {names.GPU_RESOURCE: str(gpus)}}}],
        "schedulingGates": [{"name": g} for g in gates],
        "nodeSelector": dict(node_selector or {}),
        "tolerations": list(tolerations),
    }
    if node is not None:
        spec["nodeName"] = node
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "creationTimestamp": f"2026-01-01T00:00:{created:02d}Z",
            "labels": all_labels,
            "annotations": notes,
        },
        "spec": spec,
        "status": {"phase": "Running" if node else "Pending"},
    }


def flavored(count: int) -> list[Node]:
    """The flavor's nodes: its labels, and its taint against pods Kueue did not admit."""
    return [node(f"h{i}", gpus=8, labels=FLAVOR, taints=(FLAVOR_TAINT,)) for i in range(count)]


def kueue_pod(name: str, **fields: Any) -> PodRequest:
    return convert.pod(raw_pod(name, **fields))


def admitted(name: str, **fields: Any) -> PodRequest:
    """A member Kueue has admitted: ungated, with the flavor's node selector and toleration."""
    tolerate = {"key": FLAVOR_TAINT.key, "operator": "Exists", "effect": "NoSchedule"}
    return kueue_pod(name, node_selector=FLAVOR, tolerations=[tolerate], **fields)


def gangs_of(pods: Sequence[PodRequest]) -> list[Gang]:
    gangs, invalid = build_gangs(pods, {}, SCHED)
    assert invalid == []
    return gangs


def decide(snap: Snapshot, queue: GangQueue | None = None) -> list[Decision]:
    """Every decision the cycles make on ``snap`` at one instant, bindings applied as made."""
    if queue is None:
        queue = GangQueue()
    decisions: list[Decision] = []
    while True:
        gangs, _ = build_gangs(snap.pods.values(), {}, SCHED)
        decision = run_cycle(gangs, queue, snap, 0, Config())
        if decision is None:
            return decisions
        decisions.append(decision)
        snap = snap.with_assignments(decision.bindings)


def bound(decisions: Sequence[Decision]) -> dict[str, str]:
    return {a.pod.split("/")[1]: a.node for d in decisions for a in d.bindings}


# -- a Kueue pod group is one gang ---------------------------------------------------------------


def test_a_kueue_pod_group_is_one_gang_of_its_total_count() -> None:
    # shoal.dev/max-member is not read: Kueue admitted the group for its total count only.
    pods = [kueue_pod(f"w{i}", annotations={names.MAX_MEMBER_ANNOTATION: "8"}) for i in range(4)]
    other = kueue_pod("x0", group="other", total="1")
    found: dict[str, Gang] = {g.key: g for g in gangs_of([*pods, other])}
    gang, alone = found["ns/kueue:train"], found["ns/kueue:other"]
    assert (gang.key, gang.name, gang.min_member, gang.max_member) == (
        "ns/kueue:train",
        "kueue:train",
        4,
        4,
    )
    assert [p.name for p in gang.members] == ["w0", "w1", "w2", "w3"]
    assert (alone.key, alone.min_member, alone.max_member) == ("ns/kueue:other", 1, 1)
    assert isinstance(claim(pods[0])[0], KueuePodGroup)
    assert any(isinstance(s, KueuePodGroup) for s in NAMED)


def test_a_fast_admission_group_places_its_pods_as_they_come() -> None:
    # Kueue's StatefulSet integration: the group is admitted before its pods exist, and an
    # OrderedReady StatefulSet creates each pod once the one before it is ready.
    notes = {FAST_ADMISSION: "true", SERVING: "true"}
    first = kueue_pod("web-0", group="sts-web", total="3", annotations=notes)
    [gang] = gangs_of([first])
    assert (gang.min_member, gang.max_member) == (1, 3)
    assert bound(decide(snapshot([node("n0")], [first]))) == {"web-0": "n0"}


def test_the_group_name_annotation_wins_over_the_label() -> None:
    # Kueue's WorkloadIdentifierAnnotations feature gate writes the name as an annotation.
    by_note = kueue_pod("w0", group=None, annotations={GROUP_NAME: "train"})
    both = kueue_pod("w1", group="stale", annotations={GROUP_NAME: "train"})
    [gang] = build_gangs([by_note, both], {}, SCHED)[0]
    assert gang.key == "ns/kueue:train"
    assert len(gang.members) == 2


def test_a_group_whose_members_miss_or_disagree_on_the_count_waits_naming_the_annotation() -> None:
    _, [missing] = build_gangs([kueue_pod("w0"), kueue_pod("w1", total=None)], {}, SCHED)
    assert missing.message == (
        f"Kueue pod group ns/train: pod w1 has no annotation {TOTAL_COUNT}; every member must "
        "say how many pods the group has (Kueue admits none of it until they do)"
    )
    _, [differ] = build_gangs([kueue_pod("w0"), kueue_pod("w1", total="3")], {}, SCHED)
    assert differ.message == (
        f"Kueue pod group ns/train: members give different annotation {TOTAL_COUNT} values "
        "('3', '4'); every member must give the same"
    )
    _, [zero] = build_gangs([kueue_pod("w0", total="0")], {}, SCHED)
    assert zero.message == (
        f"Kueue pod group ns/train annotation {TOTAL_COUNT}: must be at least 1, got 0"
    )
    assert [p.name for p in differ.members] == ["w0", "w1"]


def test_a_pod_naming_a_kueue_group_and_a_shoal_gang_waits_naming_both() -> None:
    both = kueue_pod("w3", labels={names.GANG_LABEL: "train"})
    rest = [kueue_pod(f"w{i}") for i in range(3)]
    gangs, [conflict] = build_gangs([*rest, both], {}, SCHED)
    assert conflict.members == (both,)
    assert conflict.message == (
        "pod w3 names more than one gang (label kueue.x-k8s.io/pod-group-name: gang "
        "ns/kueue:train; label shoal.dev/gang: gang ns/train); it waits until it names one"
    )
    # The rest of the group waits for it: none of it is bound without its fourth member.
    nodes = [node(f"n{i}", gpus=8) for i in range(4)]
    assert bound(decide(snapshot(nodes, [*rest, both]))) == {}
    [gang] = gangs
    assert (gang.key, len(gang.members), gang.min_member) == ("ns/kueue:train", 3, 4)


def test_a_pod_naming_a_kueue_group_and_a_pod_group_waits_naming_both() -> None:
    both = kueue_pod("w0", labels={names.POD_GROUP_LABEL: "train"})
    _, [conflict] = build_gangs([both], {"ns/train": group("train", 1)}, SCHED)
    assert "label scheduling.x-k8s.io/pod-group: gang ns/train" in conflict.message
    assert "label kueue.x-k8s.io/pod-group-name: gang ns/kueue:train" in conflict.message


# -- Kueue's admission: gates ----------------------------------------------------------------------


@pytest.mark.parametrize("gate", [ADMISSION_GATE, TOPOLOGY_GATE, ELASTIC_JOB_GATE, "example.com/x"])
def test_any_scheduling_gate_makes_a_pod_gated(gate: str) -> None:
    assert kueue_pod("w0", gates=[gate]).gated
    assert not kueue_pod("w0").gated


def test_a_kueue_group_with_one_gated_member_binds_none_then_all_once_it_is_ungated() -> None:
    nodes = flavored(2)
    # Kueue ungates the members of an admitted group one patch each: three are seen first.
    partly = [admitted(f"w{i}") for i in range(3)] + [kueue_pod("w3", gates=[ADMISSION_GATE])]
    queue = GangQueue()
    decisions = decide(snapshot(nodes, partly), queue)
    assert bound(decisions) == {}
    [waiting] = decisions
    assert waiting.unschedulable is not None
    assert waiting.unschedulable.message() == (
        "gang kueue:train has 3 of the 4 members its minimum needs; waiting for 1 more before "
        "any is bound."
    )
    # The gang backed off: ungated, it is not tried again until its backoff ends, or until the
    # loop is woken with room, as the last gate's removal now wakes it (ending every backoff).
    whole = [*partly[:3], admitted("w3")]
    assert decide(snapshot(nodes, whole), queue) == []
    queue.wake()
    assert sorted(bound(decide(snapshot(nodes, whole), queue))) == ["w0", "w1", "w2", "w3"]


def test_a_topology_gate_left_on_one_member_holds_the_whole_group_back() -> None:
    pods = [admitted(f"w{i}") for i in range(3)] + [admitted("w3", gates=[TOPOLOGY_GATE])]
    assert bound(decide(snapshot(flavored(2), pods))) == {}
    pods[3] = admitted("w3")
    assert len(bound(decide(snapshot(flavored(2), pods)))) == 4


def test_a_gated_member_is_never_bound_as_surplus_beyond_what_kueue_admitted() -> None:
    # An elastic Job under Kueue's workload slices: 2 workers admitted and running, the job
    # scaled to 4, the 2 new pods gated until a new slice is admitted. The gang (2 to 4 by
    # Shoal's own bounds) has room and free nodes, and still binds none of them.
    notes = {names.MIN_MEMBER_ANNOTATION: "2", names.MAX_MEMBER_ANNOTATION: "4"}
    labels = {names.GANG_LABEL: "elastic"}

    def worker(name: str, **fields: Any) -> PodRequest:
        return kueue_pod(name, group=None, total=None, labels=labels, annotations=notes, **fields)

    nodes = [node(f"n{i}", gpus=8) for i in range(4)]
    running = [worker("w0", node="n0"), worker("w1", node="n1")]
    grown = [worker("w2", gates=[ELASTIC_JOB_GATE]), worker("w3", gates=[ELASTIC_JOB_GATE])]
    assert bound(decide(snapshot(nodes, [*running, *grown]))) == {}
    # The slice admits one more: exactly that one is bound.
    one_more = [worker("w2"), grown[1]]
    assert list(bound(decide(snapshot(nodes, [*running, *one_more])))) == ["w2"]


@pytest.mark.reliability
def test_removing_the_last_gate_wakes_the_loop_and_ends_backoffs() -> None:
    # Before, an ungated pod waited for the idle wake (5 s) and its gang's backoff (up to
    # --max-backoff): Kueue ungates a group one patch per pod, so the gang had backed off.
    woken: list[bool] = []
    view = ClusterView(object(), Cache(), woken.append)
    view._pod_event("ADDED", raw_pod("w0", gates=[ADMISSION_GATE, TOPOLOGY_GATE]))
    assert woken == [True]
    view._pod_event("MODIFIED", raw_pod("w0", gates=[TOPOLOGY_GATE]))  # still gated
    assert woken == [True]
    view._pod_event("MODIFIED", raw_pod("w0", node_selector={"kubernetes.io/hostname": "n0"}))
    assert woken == [True, True]


# -- Kueue's admission: where the pods may go ---------------------------------------------------


def test_a_flavors_node_selector_keeps_the_whole_gang_on_its_nodes() -> None:
    others = [node(f"n{i}", gpus=8) for i in range(4)]
    pods = [admitted(f"w{i}") for i in range(4)]
    placed = bound(decide(snapshot([*others, *flavored(2)], pods)))
    assert sorted(placed) == ["w0", "w1", "w2", "w3"]
    assert set(placed.values()) == {"h0", "h1"}


def test_a_gang_the_flavors_nodes_cannot_hold_is_bound_nowhere_else() -> None:
    others = [node(f"n{i}", gpus=8) for i in range(4)]
    pods = [admitted(f"w{i}") for i in range(4)]
    decisions = decide(snapshot([*others, *flavored(1)], pods))
    assert bound(decisions) == {}
    [refused] = decisions
    assert refused.unschedulable is not None
    assert refused.unschedulable.reasons.get(filters.SELECTOR) == 4


def test_a_topology_assignment_puts_each_member_on_its_own_domain() -> None:
    # Kueue's topology ungater gives each pod the node of its assigned domain as a selector.
    nodes = [node(f"n{i}", gpus=8) for i in range(4)]
    hosts = {"w0": "n3", "w1": "n1", "w2": "n0", "w3": "n2"}
    pods = [
        kueue_pod(name, node_selector={"kubernetes.io/hostname": host})
        for name, host in hosts.items()
    ]
    assert bound(decide(snapshot(nodes, pods))) == hosts
