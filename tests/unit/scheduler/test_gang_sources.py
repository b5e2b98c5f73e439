"""Volcano PodGroups as a gang source, and pods that more than one source claims."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from contracts import names
from scheduler.cache import Cache
from scheduler.gang import build_gangs
from scheduler.gang.kinds import KINDS, ConditionPatch, StatusPatch
from scheduler.gang.kinds.kubernetes import Kubernetes
from scheduler.gang.kinds.volcano import Volcano
from scheduler.k8s import convert
from scheduler.k8s.client import TokenBucket
from scheduler.k8s.group_view import _NewestServed
from scheduler.k8s.status import ApiReporter
from scheduler.model import (
    Gang,
    GangKey,
    PodGroup,
    PodRequest,
    group_ref,
    split_group_ref,
)
from tests.unit.scheduler.builders import SCHED, group, pod

VOLCANO = Volcano()
K8S = Kubernetes()


def volcano(name: str, min_member: object, **fields: Any) -> PodGroup:
    base = PodGroup(namespace="ns", name=name, min_member=min_member, kind=VOLCANO.tag)
    return replace(base, **fields)


def k8s_condition(gang: Gang) -> dict[str, Any]:
    write = K8S.status(gang)
    assert isinstance(write, ConditionPatch)
    assert write.sticky
    return dict(write.condition)


def merged_condition(raw: dict[str, Any], condition: dict[str, Any], now: str) -> Any:
    sticky = condition["type"] == "PodGroupInitiallyScheduled"
    return ConditionPatch(condition, sticky=sticky).merged(raw, now)


def volcano_status(gang: Gang) -> dict[str, Any]:
    write = VOLCANO.status(gang)
    assert isinstance(write, StatusPatch)
    assert not write.subresource  # the CRD has none: patched on the object
    return dict(write.status)


def member(
    name: str,
    group_name: str,
    task: str | None = None,
    *,
    priority: int = 0,
    node: str | None = None,
) -> PodRequest:
    notes = {names.VOLCANO_GROUP_ANNOTATION: group_name}
    if task is not None:
        notes[names.VOLCANO_TASK_ANNOTATION] = task
    return pod(name, annotations=notes, priority=priority, node=node)


def test_group_references_tell_kinds_apart_and_round_trip() -> None:
    for kind in KINDS:
        ref = group_ref(kind.tag, "ns", "train")
        assert split_group_ref(ref) == (kind.tag, "ns", "train")
        assert KINDS.of_ref(ref) is kind
    assert group_ref(KINDS.tagged("").tag, "ns", "train") == "ns/train"
    assert len({group_ref(kind.tag, "ns", "train") for kind in KINDS}) == 3


def test_volcano_group_sizes_priority_and_queue_notice() -> None:
    members = [member(f"w{i}", "train", priority=5) for i in range(3)]
    g = volcano(
        "train", 2, annotations={names.MAX_MEMBER_ANNOTATION: "4"}, priority=900, queue="research"
    )
    gangs, invalid = build_gangs(members, {g.ref: g}, SCHED)
    assert invalid == []
    [gang] = gangs
    assert (gang.min_member, gang.max_member, gang.priority) == (2, 4, 900)
    assert gang.pod_group == "ns/volcano/train"
    assert "spec.queue 'research' is ignored" in gang.pod_group_notice


def test_volcano_group_without_a_class_value_takes_its_members_priority_and_every_pod() -> None:
    members = [member(f"w{i}", "train", priority=5) for i in range(3)]
    g = volcano("train", 2, priority_class="missing")
    [gang], _ = build_gangs(members, {g.ref: g}, SCHED)
    assert (gang.max_member, gang.priority, gang.pod_group_notice) == (3, 5, "")


def test_a_scheduler_plugins_group_of_the_same_name_is_another_gang() -> None:
    volcano_members = [member("v0", "train")]
    plugin_members = [pod("p0", pod_group="train"), pod("p1", pod_group="train")]
    groups = {"ns/train": group("train", 2), "ns/volcano/train": volcano("train", 1)}
    gangs, invalid = build_gangs([*volcano_members, *plugin_members], groups, SCHED)
    assert invalid == []
    assert sorted((g.key, len(g.members)) for g in gangs) == [
        ("ns/train", 2),
        ("ns/volcano/train", 1),
    ]


def test_min_task_member_waits_for_every_task_and_a_zero_asks_for_none() -> None:
    g = volcano("train", 1, min_task_member={"ps": 1, "worker": 2, "eval": 0})
    short = [member("w0", "train", "worker"), member("p0", "train", "ps")]
    gangs, [bad] = build_gangs(short, {g.ref: g}, SCHED)
    assert gangs == []
    assert "task worker has 1 of 2" in bad.message
    assert "task ps" not in bad.message
    assert "task eval" not in bad.message
    enough = [*short, member("w1", "train", "worker")]
    [gang], invalid = build_gangs(enough, {g.ref: g}, SCHED)
    assert invalid == []
    assert len(gang.members) == 3


def test_wrong_volcano_fields_are_messages_naming_them() -> None:
    members = [member("w0", "train")]
    for g, text in (
        (volcano("train", 0), "spec.minMember: must be at least 1"),
        (volcano("train", 1, min_task_member={"ps": "x"}), "spec.minTaskMember[ps]"),
        (
            volcano("train", 2, annotations={names.MAX_MEMBER_ANNOTATION: "1"}),
            "the maximum must be at least the minimum",
        ),
    ):
        gangs, [bad] = build_gangs(members, {g.ref: g}, SCHED)
        assert gangs == []
        assert text in bad.message
        assert bad.pod_group == "ns/volcano/train"


def test_a_missing_volcano_group_keeps_its_members_waiting() -> None:
    gangs, [bad] = build_gangs([member("w0", "ghost")], {}, SCHED)
    assert gangs == []
    assert "Volcano PodGroup ns/ghost" in bad.message
    assert "does not exist" in bad.message


def test_a_pod_two_group_sources_claim_is_in_no_gang() -> None:
    both = pod("both", pod_group="a", annotations={names.VOLCANO_GROUP_ANNOTATION: "b"})
    groups = {"ns/a": group("a", 1), "ns/volcano/b": volcano("b", 1)}
    gangs, [bad] = build_gangs([both], groups, SCHED)
    assert gangs == []
    assert bad.members == (both,)
    assert "names more than one gang" in bad.message
    assert "gang ns/a" in bad.message
    assert "gang ns/volcano/b" in bad.message


def test_a_volcano_group_wins_over_a_gang_label() -> None:
    p = pod("w0", gang="other", annotations={names.VOLCANO_GROUP_ANNOTATION: "train"})
    g = volcano("train", 1)
    [gang], _ = build_gangs([p], {g.ref: g}, SCHED)
    assert gang.key == "ns/volcano/train"


def test_convert_reads_a_volcano_group_and_its_class_value() -> None:
    raw = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "metadata": {"namespace": "ns", "name": "train", "uid": "u1"},
        "spec": {
            "minMember": 2,
            "minTaskMember": {"ps": 1},
            "queue": "q",
            "priorityClassName": "high",
        },
    }
    g = VOLCANO.convert(raw, {"high": 7})
    assert (g.ref, g.min_member, g.priority, g.queue, g.version) == (
        "ns/volcano/train",
        2,
        7,
        "q",
        "v1beta1",
    )
    assert dict(g.min_task_member) == {"ps": 1}
    assert VOLCANO.convert(raw, {}).priority is None


def test_replacing_one_apis_groups_keeps_the_others() -> None:
    cache = Cache()
    cache.set_pod_group(group("a", 1))
    cache.replace_pod_groups([volcano("a", 1)], VOLCANO.tag)
    assert set(cache.snapshot().pod_groups) == {"ns/a", "ns/volcano/a"}
    cache.replace_pod_groups([], "")
    assert set(cache.snapshot().pod_groups) == {"ns/volcano/a"}


def test_volcano_status_phases() -> None:
    g = volcano("train", 2)
    waiting = [member("w0", "train"), member("w1", "train")]
    [gang], _ = build_gangs(waiting, {g.ref: g}, SCHED)
    assert volcano_status(gang)["phase"] == "Pending"
    bound = [member("w0", "train", node="n1"), member("w1", "train", node="n2")]
    [gang], _ = build_gangs(bound, {g.ref: g}, SCHED)
    assert volcano_status(gang)["phase"] == "Inqueue"
    assert VOLCANO.path(g.ref, "v1beta1") == (
        "/apis/scheduling.volcano.sh/v1beta1/namespaces/ns/podgroups/train"
    )


def k8s_member(name: str, group_name: str, **kw: Any) -> PodRequest:
    return replace(pod(name, **kw), scheduling_group=group_name)


def k8s_raw(policy: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "metadata": {"namespace": "ns", "name": "train", "uid": "u2"},
        "spec": {"schedulingPolicy": policy, **spec},
    }


def test_kubernetes_group_sizes_and_priority_follow_its_spec() -> None:
    members = [k8s_member(f"w{i}", "train", priority=3) for i in range(3)]
    g = K8S.convert(k8s_raw({"gang": {"minCount": 2}}, priority=50), {})
    assert (g.ref, g.version) == ("ns/k8s/train", "v1beta1")
    [gang], invalid = build_gangs(members, {g.ref: g}, SCHED)
    assert invalid == []
    assert (gang.min_member, gang.max_member, gang.priority) == (2, 3, 50)
    raised = K8S.convert(k8s_raw({"gang": {"minCount": 3}}), {})
    [gang], _ = build_gangs(members, {g.ref: raised}, SCHED)
    assert gang.min_member == 3  # minCount is mutable; the gang follows it


def test_kubernetes_basic_policy_is_a_group_of_minimum_one_and_no_policy_is_a_message() -> None:
    members = [k8s_member(f"w{i}", "train") for i in range(2)]
    basic = K8S.convert(k8s_raw({"basic": {}}), {})
    [gang], _ = build_gangs(members, {basic.ref: basic}, SCHED)
    assert (gang.min_member, gang.max_member) == (1, 2)
    neither = K8S.convert(k8s_raw({}), {})
    _, [bad] = build_gangs(members, {neither.ref: neither}, SCHED)
    assert "neither gang nor basic" in bad.message
    _, [missing] = build_gangs(members, {}, SCHED)
    assert "spec.schedulingGroup.podGroupName, does not exist" in missing.message


def test_a_gang_label_wins_over_a_scheduling_group_a_job_controller_set() -> None:
    labelled = replace(pod("w0", gang="mine", min_member="1"), scheduling_group="job-pg")
    [gang], _ = build_gangs([labelled], {}, SCHED)
    assert gang.key == "ns/mine"


def test_initially_scheduled_condition_turns_true_once_the_minimum_is_bound() -> None:
    g = K8S.convert(k8s_raw({"gang": {"minCount": 2}}), {})
    waiting = [k8s_member("w0", "train", node="n1"), k8s_member("w1", "train")]
    [gang], _ = build_gangs(waiting, {g.ref: g}, SCHED)
    condition = k8s_condition(gang)
    assert (condition["status"], condition["reason"]) == ("False", "Unschedulable")
    assert "1 of minCount 2" in condition["message"]
    bound = [k8s_member("w0", "train", node="n1"), k8s_member("w1", "train", node="n2")]
    [gang], _ = build_gangs(bound, {g.ref: g}, SCHED)
    assert k8s_condition(gang)["status"] == "True"
    done = {"status": {"conditions": [{**condition, "status": "True"}]}}
    assert merged_condition(done, condition, "t2") is None
    was = {"status": {"conditions": [{**condition, "lastTransitionTime": "t1"}]}}
    kept = merged_condition(was, condition, "t2")
    assert kept is not None
    assert kept["lastTransitionTime"] == "t1"  # the same status: no transition
    placed = k8s_condition(gang)
    assert merged_condition(was, placed, "t2") == {
        **placed,
        "lastTransitionTime": "t2",
    }
    assert merged_condition({}, condition, "t2") == {
        **condition,
        "lastTransitionTime": "t2",
    }


def test_convert_reads_the_pods_scheduling_group() -> None:
    raw = {"metadata": {"namespace": "ns", "name": "p"}, "spec": {"schedulingGroup": {}}}
    assert convert.pod(raw).scheduling_group == ""
    raw["spec"] = {"schedulingGroup": {"podGroupName": "train"}}
    assert convert.pod(raw).scheduling_group == "train"


class _Rest:
    """Records the writes; answers reads with ``current``."""

    def __init__(self, current: dict[str, Any]) -> None:
        self.current = current
        self.writes: list[tuple[str, str, dict[str, Any]]] = []

    def get(self, path: str) -> dict[str, Any]:
        return self.current

    def call(self, method: str, path: str, body: dict[str, Any], **_: Any) -> None:
        self.writes.append((method, path, body))


def test_a_pod_group_initially_scheduled_is_never_set_back_to_false() -> None:
    api = SimpleNamespace(configuration=SimpleNamespace(host="https://api.invalid"))
    reporter = ApiReporter(api, TokenBucket(0, 1), SCHED)
    done = {"status": {"conditions": [{"type": "PodGroupInitiallyScheduled", "status": "True"}]}}
    rest = _Rest(done)
    reporter._rest = rest  # type: ignore[assignment]
    g = K8S.convert(k8s_raw({"gang": {"minCount": 2}}), {})
    torn = [k8s_member("w0", "train", node="n1"), k8s_member("w1", "train")]
    [gang], _ = build_gangs(torn, {g.ref: g}, SCHED)
    reporter.gang_status(gang)
    reporter.close()
    assert rest.writes == []

    reporter = ApiReporter(api, TokenBucket(0, 1), SCHED)
    rest = _Rest({})
    reporter._rest = rest  # type: ignore[assignment]
    reporter.gang_status(gang)
    reporter.close()
    [(method, path, body)] = rest.writes
    assert (method, path) == (
        "PATCH",
        "/apis/scheduling.k8s.io/v1beta1/namespaces/ns/podgroups/train/status",
    )
    assert body["status"]["conditions"][0]["status"] == "False"


class _Custom:
    """``list_cluster_custom_object`` of an API server that serves ``served`` versions."""

    def __init__(self, *served: str) -> None:
        self.served = served
        self.asked: list[str] = []

    def list_cluster_custom_object(self, group: str, version: str, plural: str, **_: Any) -> Any:
        self.asked.append(version)
        if version not in self.served:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(release_conn=lambda: None, version=version)


def test_kubernetes_pod_groups_are_read_and_written_in_the_newest_version_served() -> None:
    custom = _Custom("v1alpha3")
    lister = _NewestServed(custom, K8S.api)
    assert lister(limit=5).version == "v1alpha3"
    assert lister(watch=True).version == "v1alpha3"
    assert custom.asked == ["v1beta1", "v1alpha3", "v1alpha3", "v1alpha3"]  # found once
    assert lister.version == "v1alpha3"  # held by the informer's lister
    assert _NewestServed(_Custom("v1alpha3", "v1beta1"), K8S.api)().version == "v1beta1"
    with pytest.raises(ApiException) as raised:
        _NewestServed(_Custom(), K8S.api)()
    assert raised.value.status == 404  # the informer takes that as "not installed"
    one = _Custom("v1beta1")
    _NewestServed(one, VOLCANO.api)()
    assert one.asked == ["v1beta1"]  # a kind with one version is listed, not probed

    api = SimpleNamespace(configuration=SimpleNamespace(host="https://api.invalid"))
    served = {K8S.tag: lister.version or ""}
    reporter = ApiReporter(api, TokenBucket(0, 1), SCHED, served=lambda k: served[k.tag])
    rest = _Rest({})
    reporter._rest = rest  # type: ignore[assignment]
    g = K8S.convert(k8s_raw({"gang": {"minCount": 2}}), {})
    [gang], _ = build_gangs([k8s_member("w0", "train")], {g.ref: g}, SCHED)
    reporter.gang_status(gang)
    reporter.close()
    [(_, path, _)] = rest.writes
    assert path == "/apis/scheduling.k8s.io/v1alpha3/namespaces/ns/podgroups/train/status"


def test_disruption_target_is_written_beside_a_true_initially_scheduled() -> None:
    preemptor = Gang(GangKey("ns/big"), "ns", "big", 4, 4, ())
    write = K8S.disrupted(SCHED, preemptor)
    assert isinstance(write, ConditionPatch)
    condition = dict(write.condition)
    assert condition == {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "PreemptionByScheduler",
        "message": f"{SCHED}: preempting to accommodate a higher priority podgroup",
    }
    single = Gang(GangKey("ns/one"), "ns", "one", 1, 1, ())
    disrupted = K8S.disrupted(SCHED, single)
    assert isinstance(disrupted, ConditionPatch)
    assert disrupted.condition["message"].endswith("priority pod")
    scheduled = {"type": "PodGroupInitiallyScheduled", "status": "True"}
    raw = {"status": {"conditions": [scheduled]}}
    assert merged_condition(raw, condition, "t2") == {
        **condition,
        "lastTransitionTime": "t2",
    }
    again = {"status": {"conditions": [scheduled, {**condition, "lastTransitionTime": "t1"}]}}
    kept = merged_condition(again, condition, "t3")
    assert kept is not None
    assert kept["lastTransitionTime"] == "t1"
