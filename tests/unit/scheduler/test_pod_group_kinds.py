"""A PodGroup kind is one module and one entry in the table of kinds: a made-up kind, put in a
table beside the three Shoal reads, has its pods claimed, its objects listed, watched and
converted, its gangs built, and its status and Events written, with nothing else told of it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from kubernetes.client.exceptions import ApiException

from scheduler.cache import Cache
from scheduler.gang import build_gangs
from scheduler.gang.kinds import KINDS, Api, GroupWrite, Kinds, PodGroupKind, StatusPatch
from scheduler.gang.kinds.base import Claim, read
from scheduler.k8s.client import TokenBucket
from scheduler.k8s.status import ApiReporter
from scheduler.k8s.view import ClusterView
from scheduler.model import Gang, PodGroup, PodRequest
from shoalctl.api import Reader
from tests.unit.scheduler.builders import SCHED, pod
from tests.waiting import eventually

TEAM_LABEL = "example.com/team"


class TeamGroup(PodGroupKind):
    """What a new kind's module holds: where its objects live, which pods it claims, how its
    object reads, the gang it defines and the status it gets."""

    tag = "team"
    title = "teams"
    api = Api("example.com", ("v2", "v1"), plural="teamgroups", kind="TeamGroup")
    claim = Claim.label(TEAM_LABEL)
    minimum_field = "spec.size"

    def convert(self, raw: Mapping[str, Any], priorities: Mapping[str, int]) -> PodGroup:
        return read(raw, self, (raw.get("spec") or {}).get("size"))

    def status(self, gang: Gang) -> GroupWrite | None:
        return StatusPatch({"bound": len(gang.bound), "wanted": gang.min_member})


TEAM = TeamGroup()
#: The one line a new kind adds to the table.
WITH_TEAM = Kinds((*KINDS, TEAM))

RAW = {
    "apiVersion": "example.com/v2",
    "kind": "TeamGroup",
    "metadata": {"namespace": "ns", "name": "blue", "uid": "u-blue"},
    "spec": {"size": 2},
}


def member(name: str, node: str | None = None, **fields: Any) -> PodRequest:
    return replace(pod(name, node=node), labels={TEAM_LABEL: "blue"}, **fields)


def test_a_new_kind_claims_its_pods_and_defines_their_gang() -> None:
    group = TEAM.convert(RAW, {})
    assert (group.ref, group.min_member, group.uid, group.version) == (
        "ns/team/blue",
        2,
        "u-blue",
        "v2",
    )
    pods = [member("w0"), member("w1")]
    [gang], invalid = build_gangs(pods, {group.ref: group}, SCHED, WITH_TEAM)
    assert invalid == []
    assert (gang.key, gang.min_member, gang.max_member, gang.pod_group) == (
        "ns/team/blue",
        2,
        2,
        "ns/team/blue",
    )
    _, [waiting] = build_gangs(pods, {}, SCHED, WITH_TEAM)
    assert waiting.message == (
        "PodGroup ns/blue (label example.com/team) does not exist; its members wait for it"
    )
    # Without the kind in the table the label means nothing: each pod is a gang of one.
    alone, _ = build_gangs(pods, {group.ref: group}, SCHED)
    assert sorted(g.key for g in alone) == ["ns/pod:w0", "ns/pod:w1"]


def test_a_pod_claimed_by_the_new_kind_and_another_waits_naming_both() -> None:
    both = member("w0", annotations={"scheduling.k8s.io/group-name": "v"})
    _, [conflict] = build_gangs([both], {}, SCHED, WITH_TEAM)
    assert "annotation scheduling.k8s.io/group-name: gang ns/volcano/v" in conflict.message
    assert "label example.com/team: gang ns/team/blue" in conflict.message


class _Rest:
    def __init__(self) -> None:
        self.writes: list[tuple[str, str, dict[str, Any]]] = []

    def get(self, path: str) -> dict[str, Any]:
        return {}

    def call(self, method: str, path: str, body: dict[str, Any], **_: Any) -> None:
        self.writes.append((method, path, body))


def test_the_new_kinds_status_and_events_are_written_where_its_objects_live() -> None:
    api = SimpleNamespace(configuration=SimpleNamespace(host="https://api.invalid"))
    reporter = ApiReporter(api, TokenBucket(1000, 1000), SCHED, kinds=WITH_TEAM)
    rest = _Rest()
    reporter._rest = rest  # type: ignore[assignment]
    group = TEAM.convert(RAW, {})
    [gang], _ = build_gangs(
        [member("w0", node="n1"), member("w1")], {group.ref: group}, SCHED, WITH_TEAM
    )
    reporter.gang_status(gang)
    reporter.unschedulable(gang, gang.pending, "0/4 nodes are available")
    eventually(lambda: reporter.backlog == 0, timeout=10, interval=0.01, what="the writes")
    reporter.close()
    writes = {(method, path): body for method, path, body in rest.writes}
    status = writes["PATCH", "/apis/example.com/v2/namespaces/ns/teamgroups/blue/status"]
    assert status == {"status": {"bound": 1, "wanted": 2}}
    events = [b for _, path, b in rest.writes if path == "/api/v1/namespaces/ns/events"]
    involved = {e["involvedObject"]["kind"]: e["involvedObject"] for e in events}
    assert involved["TeamGroup"] == {
        "apiVersion": "example.com/v2",
        "kind": "TeamGroup",
        "name": "blue",
        "uid": "u-blue",
        "namespace": "ns",
    }


def test_the_new_kind_is_listed_and_watched_in_the_newest_version_served() -> None:
    cache = Cache()
    woken: list[bool] = []
    view = ClusterView(object(), cache, woken.append, kinds=WITH_TEAM)
    [informer] = [i for i in view.informers if i.kind == "teamgroups.example.com"]
    assert view.served(TEAM) == "v2"  # not asked yet: the newest
    informer._handlers.on_list([RAW])
    assert cache.snapshot().pod_groups["ns/team/blue"].min_member == 2
    informer._handlers.on_event("MODIFIED", {**RAW, "spec": {"size": 3}})
    assert cache.snapshot().pod_groups["ns/team/blue"].min_member == 3
    informer._handlers.on_event("DELETED", RAW)
    assert "ns/team/blue" not in cache.snapshot().pod_groups
    assert woken == [True, True, True]


class _Custom:
    """An API server that serves the made-up kind in v1 only, and no other PodGroup kind."""

    def list_cluster_custom_object(self, group: str, version: str, plural: str) -> Any:
        if (group, version, plural) != ("example.com", "v1", "teamgroups"):
            raise ApiException(status=404, reason="Not Found")
        return {"items": [{**RAW, "apiVersion": "example.com/v1"}]}


def test_kubectl_shoal_lists_the_new_kind() -> None:
    api = SimpleNamespace(configuration=SimpleNamespace(host="https://api.invalid"))
    reader = Reader(api, kinds=WITH_TEAM)
    reader.custom = _Custom()
    [group] = reader.pod_groups(None)
    assert (group.ref, group.version, group.min_member) == ("ns/team/blue", "v1", 2)
