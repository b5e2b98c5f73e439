"""``kubectl shoal`` against gangs the real scheduler placed: admitted, waiting for capacity,
waiting for members, torn and reclaiming, read by a ServiceAccount that may only get and list
pods, nodes, events and PodGroups."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client

from contracts import names
from nodeagent.adapters.k8s.cluster import encode_revocation
from nodeagent.core.events import EventId, Kind, Notice, Tracked
from tests.integration.conftest import Devcluster, account_kubeconfig
from tests.integration.scheduler.conftest import (
    KWOK_TOLERATION,
    ROOT,
    TEST_LABEL,
    Pods,
    Pool,
    SchedulerProcess,
    ensure_priority_class,
)
from tests.waiting import eventually

T = TypeVar("T")
#: Seconds between two looks at the gangs while a test waits: each look is a ``python -m
#: shoalctl`` process (an interpreter and the client's imports, about a second of CPU), so the
#: default quarter second would keep a core busy starting them.
PROBE_EVERY = 1.0

#: The ClusterRole shipped for `kubectl shoal`: get and list, nothing more.
VIEWER = yaml.safe_load((ROOT / "manifests" / "viewer" / "rbac.yaml").read_text())


@pytest.fixture
def reader_kubeconfig(devcluster: Devcluster, namespace: str, tmp_path: Path) -> Iterator[str]:
    """A kubeconfig for a ServiceAccount bound to the shipped viewer role (get/list on pods,
    nodes, events, PodGroups) under a name of its own."""
    assert {v for rule in VIEWER["rules"] for v in rule["verbs"]} == {"get", "list"}
    with account_kubeconfig(
        devcluster,
        namespace,
        "reader",
        VIEWER["rules"],
        tmp_path / "reader.kubeconfig",
        role=f"shoal-reader-{uuid.uuid4().hex[:6]}",
    ) as path:
        yield path


@pytest.fixture
def more_pools(pool: Pool) -> Iterator[tuple[Pool, Pool, Pool]]:
    made = tuple(Pool(pool.devcluster, f"{pool.pool}{s}") for s in ("b", "c", "d"))
    yield made[0], made[1], made[2]
    for p in made:
        p.delete()


def shoal(kubeconfig: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "shoalctl", "--kubeconfig", kubeconfig, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    if check:
        assert done.returncode == 0, done.stderr
    return done


def until(probe: Callable[[], T | None], *, what: str) -> T:
    """``eventually`` for a probe that runs ``kubectl shoal``."""
    return eventually(probe, interval=PROBE_EVERY, what=what)


def gangs_by_name(kubeconfig: str, scheduler: str) -> dict[str, dict[str, Any]]:
    out = shoal(kubeconfig, "--scheduler-name", scheduler, "gangs", "-o", "json").stdout
    return {row["name"]: row for row in json.loads(out)}


def in_phase(kubeconfig: str, scheduler: str, name: str, phase: str) -> dict[str, Any] | None:
    row = gangs_by_name(kubeconfig, scheduler).get(name)
    return row if row is not None and row["phase"] == phase else None


def notice_on(devcluster: Devcluster, node: str, deadline: datetime) -> None:
    """The revocation annotation and taint as the node agent writes them."""
    notice = Notice(
        EventId("ev-1"), "aws", "aws/spot", Kind.TERMINATE, deadline, "spot interruption"
    )
    text = encode_revocation([Tracked(notice, datetime.now(UTC))])
    devcluster.core().patch_node(
        node,
        {
            "metadata": {"annotations": {names.REVOCATION_ANNOTATION: text}},
            "spec": {
                "taints": [
                    {
                        "key": names.KWOK_TAINT,
                        "value": names.KWOK_NODE_VALUE,
                        "effect": "NoSchedule",
                    },
                    {"key": names.REVOKING_TAINT, "value": "aws", "effect": "NoSchedule"},
                ]
            },
        },
    )


def test_gangs_why_and_nodes_in_every_state_with_read_only_rights(
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    reader_kubeconfig: str,
    more_pools: tuple[Pool, Pool, Pool],
) -> None:
    kc, sched = reader_kubeconfig, pods.scheduler
    devcluster, namespace = pods.devcluster, pods.namespace
    ensure_priority_class(devcluster, "shoal-test-high", 100000)
    # Pools of their own, so that each gang's fate depends on its own nodes only.
    other, small, spot = more_pools
    pool.add(2, gpus=8)
    other.add(2, gpus=8)
    small.add(1, gpus=8)
    [spot_node] = spot.add(1, gpus=8, spot_fraction=1.0)
    deadline = (datetime.now(UTC) + timedelta(minutes=2)).replace(microsecond=0)
    notice_on(devcluster, spot_node, deadline)
    on_b = Pods(devcluster, namespace, sched, other.pool)
    on_c = Pods(devcluster, namespace, sched, small.pool)
    start_scheduler("--reclaim-grace", "600", "--torn-grace", "600")

    pods.gang("elastic", 2, gpus=8, min_member=1, max_member=2)
    on_b.gang("ready", 2, gpus=8, min_member=2)
    on_c.gang("torn", 2, gpus=4, min_member=2)
    until(lambda: in_phase(kc, sched, "torn", "Admitted"), what="torn admitted")
    until(lambda: in_phase(kc, sched, "ready", "Admitted"), what="ready admitted")
    until(
        lambda: (r := in_phase(kc, sched, "elastic", "Admitted")) and r["bound"] == 2,
        what="elastic at its maximum",
    )
    on_b.gang("big", 2, gpus=8, min_member=2)
    on_b.gang("short", 1, gpus=1, min_member=3)
    on_c.delete(["torn-1"])
    pods.gang("urgent", 1, gpus=8, min_member=1, priority_class="shoal-test-high")

    until(
        lambda: (r := in_phase(kc, sched, "big", "Waiting")) and r["reasonCode"],
        what="big waiting with a reason",
    )
    until(lambda: in_phase(kc, sched, "short", "WaitingForMembers"), what="short")
    until(
        lambda: (
            (r := in_phase(kc, sched, "torn", "Torn"))
            and r["reasonCode"] == "GangBelowMinimum"
            and "below its minimum" in r["reason"]
        ),
        what="torn reported below its minimum",
    )
    until(lambda: in_phase(kc, sched, "urgent", "Reclaiming"), what="urgent reclaiming")
    rows = gangs_by_name(kc, sched)
    by_node = {r["name"]: r for r in json.loads(shoal(kc, "nodes", "-o", "json").stdout)}

    ns = namespace
    ready = rows["ready"]
    assert (ready["namespace"], ready["key"], ready["source"]) == (ns, f"{ns}/ready", "label")
    assert (ready["min"], ready["bound"], ready["max"], ready["members"]) == (2, 2, 2, 2)
    assert (ready["reasonCode"], ready["reason"], ready["podGroup"]) == ("", "", None)
    assert ready["ageSeconds"] >= 0
    assert ready["created"].endswith("Z")

    elastic = rows["elastic"]
    assert (elastic["phase"], elastic["min"], elastic["bound"], elastic["max"]) == (
        "Admitted",
        1,
        2,
        2,
    )
    assert elastic["leaving"] == [f"{ns}/elastic-1"]

    big = rows["big"]
    assert (big["min"], big["bound"], big["max"]) == (2, 0, 2)
    assert big["reasonCode"] == "Unschedulable"
    assert big["reason"].startswith("0/")

    short = rows["short"]
    assert (short["phase"], short["min"], short["bound"], short["members"]) == (
        "WaitingForMembers",
        3,
        0,
        1,
    )
    assert short["reasonCode"] == "WaitingForMembers"

    torn = rows["torn"]
    assert (torn["min"], torn["bound"], torn["members"]) == (2, 1, 1)

    urgent = rows["urgent"]
    assert urgent["priority"] == 100000
    assert urgent["reasonCode"] == "Reclaiming"
    assert urgent["reclaimedForIt"] == [f"{ns}/elastic-1"]
    assert f"{ns}/elastic-1" in urgent["reason"]

    # why, by pod name: the gang, what is reclaimed for it and until when.
    why = json.loads(shoal(kc, "--scheduler-name", sched, "why", "urgent-0", "-o", "json").stdout)
    assert (why["name"], why["phase"]) == ("urgent", "Reclaiming")
    [victim] = why["reclaiming"]
    assert victim["pod"] == f"{ns}/elastic-1"
    assert victim["node"]
    assert victim["leaveBy"].endswith("Z")
    assert why["decision"] == (
        "Waiting for room being reclaimed for it: 0 of min 1 (max 1) bound; "
        f"1 pod(s) asked to leave: {ns}/elastic-1."
    )

    why_elastic = json.loads(
        shoal(kc, "--scheduler-name", sched, "why", "elastic", "-o", "json").stdout
    )
    assert why_elastic["decision"] == (
        f"Admitted: 2 of min 1 (max 2) bound. {ns}/elastic-1 is asked to leave by "
        f"{victim['leaveBy']} to make room for {ns}/urgent."
    )

    why_big = yaml.safe_load(
        shoal(kc, "--scheduler-name", sched, "why", "big", "-o", "yaml").stdout
    )
    assert why_big["condition"]["reason"] == "Unschedulable"
    assert " ".join(why_big["condition"]["message"].split()) == big["reason"]
    assert "2 Insufficient nvidia.com/gpu" in big["reason"]
    assert why_big["decision"].startswith("Waiting for capacity: 0 of min 2 (max 2) bound.")
    assert [p["pod"] for p in why_big["memberPods"]] == [f"{ns}/big-0", f"{ns}/big-1"]

    missing = shoal(kc, "--scheduler-name", sched, "why", "nope", check=False)
    assert missing.returncode == 1
    assert "no gang or pod 'nope'" in missing.stderr

    # nodes: islands, rack, zone, capacity type and the notice in force.
    noticed = by_node[spot_node]
    assert noticed["capacityType"] == "spot"
    assert noticed["revoking"] is True
    assert noticed["notices"] == [
        {
            "source": "aws",
            "kind": "terminate",
            "deadline": deadline.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "reason": "spot interruption",
        }
    ]
    [torn_node] = [n for n in by_node if n.startswith(f"{pool.pool}c-")]
    row = by_node[torn_node]
    assert row["gpus"] == 8
    assert row["gpusFree"] == 4
    assert row["islandSizes"] == [4, 4]
    assert sorted(row["islandsFree"]) == [0, 4]
    assert row["capacityType"] == "on-demand"
    assert row["rack"]
    assert row["zone"]
    assert row["notices"] == []
    assert row["revoking"] is False

    # What a person reads: the table and the why report.
    table = shoal(kc, "--scheduler-name", sched, "gangs").stdout.splitlines()
    assert table[0].split() == [
        "NAME",
        "SOURCE",
        "MIN",
        "BOUND",
        "MAX",
        "PHASE",
        "AGE",
        "PRIORITY",
        "REASON",
    ]
    lines = {line.split()[0]: line for line in table[1:]}
    assert sorted(lines) == ["big", "elastic", "ready", "short", "torn", "urgent"]
    assert lines["urgent"].split()[:6] == ["urgent", "label", "1", "0", "1", "Reclaiming"]
    assert lines["urgent"].split()[7] == "100000"
    assert f"reclaiming 1 pod(s) for it: {ns}/elastic-1" in lines["urgent"]
    assert lines["ready"].split()[:6] == ["ready", "label", "2", "2", "2", "Admitted"]
    report = shoal(kc, "--scheduler-name", sched, "why", "urgent").stdout
    assert "Phase:     Reclaiming" in report
    assert f"Reclaiming for it:\n  {ns}/elastic-1 on {victim['node']}, leaves by " in report


def test_kubectl_runs_it_as_a_plugin_and_completes_names(
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    reader_kubeconfig: str,
    bin_dir: Path,
    tmp_path: Path,
) -> None:
    """``kubectl shoal`` through kubectl's own plugin lookup, with the kubeconfig from
    $KUBECONFIG, and ``kubectl __complete shoal why ...`` (what shells call on TAB)."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    for script, entry in (("kubectl-shoal", "main"), ("kubectl_complete-shoal", "complete_main")):
        path = plugins / script
        code = f"import sys; from shoalctl.cli import {entry}; sys.exit({entry}(sys.argv[1:]))"
        path.write_text(f"#!/bin/sh\nexec {sys.executable} -c '{code}' \"$@\"\n")
        path.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{plugins}:{os.environ['PATH']}",
        "KUBECONFIG": reader_kubeconfig,
        "PYTHONPATH": str(ROOT),
    }
    kubectl = str(bin_dir / "kubectl")
    empty = subprocess.run(
        [kubectl, "shoal", "gangs", "--scheduler-name", pods.scheduler],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert empty.returncode == 0, empty.stderr
    assert empty.stdout.startswith(f"No gangs for scheduler {pods.scheduler} in namespace ")
    assert "Is Shoal installed" in empty.stdout

    pods.gang("train", 2, gpus=1, min_member=3)
    start_scheduler()
    until(
        lambda: in_phase(reader_kubeconfig, pods.scheduler, "train", "WaitingForMembers"),
        what="train waiting for members",
    )
    listed = subprocess.run(
        [kubectl, "shoal", "gangs", "--scheduler-name", pods.scheduler],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.splitlines()
    assert listed[1].split()[:6] == ["train", "label", "3", "0", "3", "WaitingForMembers"]
    completed = subprocess.run(
        [kubectl, "__complete", "shoal", "--scheduler-name", pods.scheduler, "why", "tr"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.splitlines()
    assert completed[:3] == ["train", "train-0", "train-1"]


@pytest.mark.usefixtures("pod_group_crd", "volcano_crd")
def test_gangs_of_every_source_and_the_invalid_ones(
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    reader_kubeconfig: str,
) -> None:
    """PodGroups of scheduler-plugins, Volcano and Kubernetes define gangs as for the
    scheduler; a pod naming a PodGroup that does not exist, or two of them, is shown invalid
    with the scheduler's message."""
    ns, kc, sched = pods.namespace, reader_kubeconfig, pods.scheduler
    custom = client.CustomObjectsApi(pods.devcluster.api)
    for (group, version), name, spec in (
        (("scheduling.x-k8s.io", "v1alpha1"), "sp", {"minMember": 2}),
        (("scheduling.volcano.sh", "v1beta1"), "vc", {"minMember": 1}),
        (("scheduling.k8s.io", "v1beta1"), "kg", {"schedulingPolicy": {"gang": {"minCount": 2}}}),
    ):
        body = {
            "apiVersion": f"{group}/{version}",
            "kind": "PodGroup",
            "metadata": {"name": name},
            "spec": spec,
        }
        custom.create_namespaced_custom_object(group, version, ns, "podgroups", body)
    pool.add(2, gpus=8)
    for i in range(2):
        pods.create(f"sp-{i}", labels={names.POD_GROUP_LABEL: "sp"})
    pods.create("vc-0", annotations={names.VOLCANO_GROUP_ANNOTATION: "vc"})
    pods.create("ghost", labels={names.POD_GROUP_LABEL: "ghost"})
    pods.create(
        "both",
        labels={names.POD_GROUP_LABEL: "sp"},
        annotations={names.VOLCANO_GROUP_ANNOTATION: "vc"},
    )
    core = pods.devcluster.core()
    for i in range(2):
        core.create_namespaced_pod(
            ns,
            {
                "metadata": {"name": f"kg-{i}"},
                "spec": {
                    "schedulerName": sched,
                    "schedulingGroup": {"podGroupName": "kg"},
                    "tolerations": [KWOK_TOLERATION],
                    "nodeSelector": {TEST_LABEL: pool.pool},
                    "containers": [{"name": "w", "image": "registry.example/trainer:1"}],
                },
            },
        )
    start_scheduler()

    def settled() -> dict[str, dict[str, Any]] | None:
        rows = gangs_by_name(kc, sched)
        ready = [rows.get(n, {}).get("phase") for n in ("sp", "vc", "kg")]
        invalid = [rows.get(n, {}).get("reasonCode") for n in ("ghost", "both")]
        done = ready == ["Admitted"] * 3 and all(invalid)
        return rows if done else None

    rows = until(settled, what="every source's gang admitted, the invalid ones reported")
    got = {
        n: (r["source"], r["podGroup"], r["min"], r["bound"], r["phase"])
        for n, r in rows.items()
        if n in ("sp", "vc", "kg")
    }
    assert got == {
        "sp": ("scheduler-plugins", f"{ns}/sp", 2, 2, "Admitted"),
        "vc": ("volcano", f"{ns}/volcano/vc", 1, 1, "Admitted"),
        "kg": ("kubernetes", f"{ns}/k8s/kg", 2, 2, "Admitted"),
    }
    ghost = rows["ghost"]
    assert (ghost["phase"], ghost["reasonCode"], ghost["min"]) == (
        "Invalid",
        "PodGroupNotFound",
        None,
    )
    assert "ghost" in ghost["reason"]
    assert "does not exist" in ghost["reason"]
    both = rows["both"]
    assert (both["phase"], both["source"], both["key"]) == (
        "Invalid",
        "conflict",
        f"{ns}/conflict:both",
    )
    assert "names more than one gang" in both["reason"]
    why = json.loads(shoal(kc, "--scheduler-name", sched, "why", "both", "-o", "json").stdout)
    assert why["decision"].startswith("Not scheduled: its definition is wrong (InvalidGang): ")
