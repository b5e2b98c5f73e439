"""``kubectl shoal``'s views and output from API objects as the API server sends them."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from contracts import gputopology, names
from shoalctl import cli, render, views

NOW = 1_800_000_000.0
SCHED = "shoal-scheduler"


def pod(
    name: str,
    *,
    gang: str | None = None,
    node: str | None = None,
    gpus: int = 1,
    min_member: int | None = None,
    annotations: dict[str, str] | None = None,
    condition: tuple[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    notes = dict(annotations or {})
    if min_member is not None:
        notes[names.MIN_MEMBER_ANNOTATION] = str(min_member)
    status: dict[str, Any] = {"phase": "Running" if node else "Pending"}
    if condition:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": condition[0],
                "message": condition[1],
                "lastTransitionTime": "2027-01-15T08:00:00Z",
            }
        ]
    spec: dict[str, Any] = {
        "schedulerName": SCHED,
        "containers": [{"name": "w", "resources": {"requests": {names.GPU_RESOURCE: str(gpus)}}}],
    }
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {
            "namespace": "ml",
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": "2027-01-15T07:59:00Z",
            "labels": {**({names.GANG_LABEL: gang} if gang else {}), **(labels or {})},
            "annotations": notes,
        },
        "spec": spec,
        "status": status,
    }


def event(on: str, reason: str, message: str, at: str, *, by: str = SCHED) -> dict[str, Any]:
    return {
        "involvedObject": {"kind": "Pod", "namespace": "ml", "name": on},
        "reason": reason,
        "message": message,
        "lastTimestamp": at,
        "reportingComponent": by,
        "source": {"component": by},
    }


def cluster(
    pods: list[dict[str, Any]], events: list[dict[str, Any]] | None = None
) -> views.Cluster:
    return views.Cluster(pods=pods, nodes=[], events=events or [], groups=[])


def rows_of(c: views.Cluster) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in views.gangs(c, SCHED, NOW)}


def test_each_phase_and_its_reason() -> None:
    msg = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    torn_msg = "Gang torn is below its minimum: 1 of 2 bound, 0 pending; waiting for 1 more."
    found = rows_of(
        cluster(
            [
                pod("a-0", gang="a", node="n1", min_member=2),
                pod("a-1", gang="a", node="n2", min_member=2),
                pod("torn-0", gang="torn", node="n1", min_member=2),
                pod("few-0", gang="few", min_member=3),
                pod("big-0", gang="big", min_member=1, condition=("Unschedulable", msg)),
                pod("hi-0", gang="hi", min_member=1, condition=("Unschedulable", msg)),
                pod(
                    "victim",
                    node="n2",
                    annotations={
                        names.LEAVE_BY_ANNOTATION: "2027-01-15T08:05:00Z",
                        names.RECLAIMED_FOR_ANNOTATION: "ml/hi",
                    },
                ),
            ],
            [
                event("torn-0", "GangBelowMinimum", "older", "2027-01-15T08:00:00Z"),
                event("torn-0", "GangBelowMinimum", torn_msg, "2027-01-15T08:01:00Z"),
                event("torn-0", "GangBelowMinimum", "not ours", "2027-01-15T08:02:00Z", by="x"),
            ],
        )
    )
    phases = {name: (r["phase"], r["min"], r["bound"], r["max"]) for name, r in found.items()}
    assert phases == {
        "a": ("Admitted", 2, 2, 2),
        "torn": ("Torn", 2, 1, 2),
        "few": ("WaitingForMembers", 3, 0, 3),
        "big": ("Waiting", 1, 0, 1),
        "hi": ("Reclaiming", 1, 0, 1),
        "victim": ("Admitted", 1, 1, 1),
    }
    assert (found["a"]["reasonCode"], found["a"]["reason"]) == ("", "")
    assert (found["torn"]["reasonCode"], found["torn"]["reason"]) == ("GangBelowMinimum", torn_msg)
    assert found["few"]["reasonCode"] == "WaitingForMembers"
    assert found["few"]["reason"] == "1 of 3 member(s) exist"
    assert (found["big"]["reasonCode"], found["big"]["reason"]) == ("Unschedulable", msg)
    assert found["hi"]["reason"] == f"reclaiming 1 pod(s) for it: ml/victim; {msg}"
    assert found["hi"]["reclaimedForIt"] == ["ml/victim"]
    assert found["victim"]["source"] == "pod"
    assert found["victim"]["leaving"] == ["ml/victim"]
    assert (found["a"]["created"], found["a"]["ageSeconds"]) == ("2027-01-15T07:59:00Z", 60)


def test_a_pod_group_that_does_not_exist_is_shown_invalid_with_its_message() -> None:
    found = rows_of(cluster([pod("w-0", labels={names.POD_GROUP_LABEL: "missing"})]))
    [row] = found.values()
    assert row["phase"] == "Invalid"
    assert row["reasonCode"] == "PodGroupNotFound"
    assert "missing" in row["reason"]
    assert (row["min"], row["max"], row["priority"]) == (None, None, None)


def test_a_gang_for_another_scheduler_is_not_shown() -> None:
    other = pod("x-0", gang="x")
    other["spec"]["schedulerName"] = "default-scheduler"
    assert views.gangs(cluster([other]), SCHED, NOW) == []


def test_why_finds_the_gang_by_pod_or_gang_name_and_says_what_it_waits_for() -> None:
    c = cluster([pod("few-0", gang="few", min_member=3), pod("few-1", gang="few", min_member=3)])
    by_pod = views.why(c, SCHED, "ml", "few-1", NOW)
    by_gang = views.why(c, SCHED, "ml", "few", NOW)
    assert by_pod == by_gang
    assert by_pod is not None
    assert by_pod["decision"] == ("Waiting for members: 2 of 3 exist, none bound until all 3 do.")
    assert [p["pod"] for p in by_pod["memberPods"]] == ["ml/few-0", "ml/few-1"]
    assert views.why(c, SCHED, "ml", "nobody", NOW) is None
    assert views.why(c, SCHED, "other", "few", NOW) is None


def node(name: str, *, annotations: dict[str, str], labels: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {},
        "status": {"allocatable": {names.GPU_RESOURCE: "8", "cpu": "96", "pods": "110"}},
    }


def test_nodes_free_gpus_per_island_capacity_type_and_notices() -> None:
    topo = gputopology.encode(gputopology.uniform(8, island_size=4))
    notice = json.dumps(
        {
            "source": "aws",
            "deadline": "2027-01-15T08:02:00Z",
            "notices": [
                {
                    "source": "aws",
                    "kind": "terminate",
                    "deadline": "2027-01-15T08:02:00Z",
                    "reason": "spot interruption",
                }
            ],
        }
    )
    nodes = [
        node(
            "n1",
            annotations={names.GPU_TOPOLOGY_ANNOTATION: topo},
            labels={names.RACK_LABEL: "rack-0", names.ZONE_LABEL: "z-a"},
        ),
        node(
            "n2",
            annotations={names.REVOCATION_ANNOTATION: notice},
            labels={names.CAPACITY_TYPE_LABEL: "spot"},
        ),
    ]
    nodes[1]["spec"]["taints"] = [{"key": names.REVOKING_TAINT, "value": "aws"}]
    c = views.Cluster(
        pods=[pod("p", node="n1", gpus=3), pod("q", node="n2", gpus=2)],
        nodes=nodes,
        events=[],
        groups=[],
    )
    n1, n2 = views.nodes(c, NOW)
    assert (n1["gpus"], n1["gpusFree"], n1["islandSizes"], n1["islandsFree"]) == (
        8,
        5,
        [4, 4],
        [1, 4],
    )
    assert (n1["capacityType"], n1["rack"], n1["zone"], n1["notices"]) == (
        "on-demand",
        "rack-0",
        "z-a",
        [],
    )
    assert (n2["gpusFree"], n2["islandsFree"], n2["capacityType"], n2["revoking"]) == (
        6,
        None,
        "spot",
        True,
    )
    assert n2["notices"] == [
        {
            "source": "aws",
            "kind": "terminate",
            "deadline": "2027-01-15T08:02:00Z",
            "reason": "spot interruption",
        }
    ]
    text = render.nodes_table([n1, n2])
    assert text.splitlines()[1].split() == [
        "n1",
        "on-demand",
        "z-a",
        "rack-0",
        "8",
        "5",
        "1/4",
        "4/4",
    ]
    assert text.splitlines()[2].endswith("aws terminate by 2027-01-15T08:02:00Z")


def test_table_pads_columns_and_shows_missing_values_as_dashes() -> None:
    text = render.table(["NAME", "MIN"], [["a", 1], ["longer", None]])
    assert text == "NAME     MIN\na        1\nlonger   -\n"


def test_age_reads_like_kubectl() -> None:
    assert [render.age(s) for s in (5, 59, 60, 3599, 7200, 86400 * 3, None)] == [
        "5s",
        "59s",
        "1m",
        "59m",
        "2h",
        "3d",
        "<unknown>",
    ]


def test_json_and_yaml_are_the_same_document() -> None:
    rows = views.gangs(cluster([pod("a-0", gang="a", node="n1")]), SCHED, NOW)
    assert (
        json.loads(render.dump(rows, "json")) == yaml.safe_load(render.dump(rows, "yaml")) == rows
    )


def test_a_long_reason_is_cut_in_the_table_only() -> None:
    long = "x" * 300
    rows = views.gangs(
        cluster([pod("b-0", gang="b", condition=("Unschedulable", long))]), SCHED, NOW
    )
    assert rows[0]["reason"] == long
    line = render.gangs_table(rows, all_namespaces=True).splitlines()[1]
    assert line.split()[0] == "ml"
    assert line.endswith("x" * (render.REASON_WIDTH - 3) + "...")


def test_completion_offers_commands_then_names() -> None:
    assert cli.candidates(["g"]) == ["gangs"]
    assert cli.candidates([""]) == list(cli.COMMANDS)
    seen: list[dict[str, str]] = []

    def lister(scope: dict[str, str]) -> list[str]:
        seen.append(scope)
        return ["train", "train-0", "eval"]

    words = ["--kubeconfig", "/k", "why", "-n", "ml", "--scheduler-name", "s", "tr"]
    assert cli.candidates(words, lister) == ["train", "train-0"]
    assert seen == [{"kubeconfig": "/k", "namespace": "ml", "scheduler_name": "s"}]
    assert cli.candidates(["gangs", "x"], lister) == []


def test_completion_bash_prints_a_script_for_kubectl_shoal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert "complete -F _kubectl_shoal kubectl-shoal" in script
    assert "kubectl_complete-shoal" in script


def test_the_completer_ends_with_kubectls_no_file_directive(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.complete_main(["wh"]) == 0
    assert capsys.readouterr().out == "why\n:4\n"
