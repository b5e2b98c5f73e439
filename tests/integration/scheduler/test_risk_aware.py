"""Risk-aware placement on a real API server: notices on one capacity pool, as the agent marks
them, teach the scheduler that pool's revocation rate; a new gang's quorum then avoids it, and
the rate survives a restart of the scheduler (it is kept in a ConfigMap)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from contracts import names
from nodeagent.adapters.k8s.cluster import encode_revocation
from nodeagent.core.events import EventId, Kind, Notice, Tracked
from scheduler.placement.risk import INSTANCE_TYPE_LABEL, MAX_QUORUM_RISK_ANNOTATION
from tests.integration.conftest import Devcluster
from tests.integration.scheduler.conftest import ROOT, Pods, Pool, SchedulerProcess
from tests.waiting import eventually

NAMESPACE = "kube-system"  # the scheduler's --lease-namespace
KWOK = {"key": names.KWOK_TAINT, "value": names.KWOK_NODE_VALUE, "effect": "NoSchedule"}


@pytest.fixture
def risk_configmap(devcluster: Devcluster, scheduler_name: str) -> Iterator[str]:
    name = f"{scheduler_name}-capacity-risk"
    yield name
    try:
        devcluster.core().delete_namespaced_config_map(name, NAMESPACE)
    except ApiException as exc:
        if exc.status != 404:
            raise


def revoke(devcluster: Devcluster, node: str) -> None:
    """Mark ``node`` as the agent does when it hears a spot notice."""
    deadline = datetime.now(UTC) + timedelta(minutes=2)
    notice = Notice(EventId(f"ev-{node}"), "aws", "aws/spot", Kind.TERMINATE, deadline, "spot")
    text = encode_revocation([Tracked(notice, datetime.now(UTC))])
    devcluster.core().patch_node(
        node,
        {
            "metadata": {"annotations": {names.REVOCATION_ANNOTATION: text}},
            "spec": {
                "taints": [
                    KWOK,
                    {"key": names.REVOKING_TAINT, "value": "aws", "effect": "NoSchedule"},
                ]
            },
        },
    )


def back(devcluster: Devcluster, node: str) -> None:
    """The notice is over: the agent's taint and annotation are gone."""
    devcluster.core().patch_node(
        node,
        {
            "metadata": {"annotations": {names.REVOCATION_ANNOTATION: None}},
            "spec": {"taints": [KWOK]},
        },
    )


def learned(devcluster: Devcluster, configmap: str) -> dict[str, Any] | None:
    """The counts the scheduler keeps, once written."""
    try:
        found = devcluster.core().read_namespaced_config_map(configmap, NAMESPACE)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    text = (found.data or {}).get("counts.json")
    return json.loads(text) if text else None


def revocations(devcluster: Devcluster, configmap: str, instance_type: str) -> float:
    counts = learned(devcluster, configmap) or {}
    return float(
        sum(
            row["revocations"]
            for row in counts.get("pools", [])
            if row["instanceType"] == instance_type
        )
    )


def test_a_new_gangs_quorum_avoids_the_pool_revoked_before_and_after_a_restart(
    devcluster: Devcluster,
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    risk_configmap: str,
) -> None:
    # Two spot pools in one rack: "risky" has 4-GPU nodes, the tight fit for the 4-GPU members
    # below (without risk, every quorum would go there), "safe" 8-GPU nodes.
    rack = {names.RACK_LABEL: f"{pool.pool}-rack"}
    risky = pool.add(
        2,
        gpus=4,
        prefix="risky",
        spot_fraction=1.0,
        extra_labels={INSTANCE_TYPE_LABEL: "p3.8xlarge", **rack},
    )
    safe = pool.add(
        2,
        gpus=8,
        prefix="safe",
        spot_fraction=1.0,
        extra_labels={INSTANCE_TYPE_LABEL: "g5.48xlarge", **rack},
    )
    first_process = start_scheduler("--capacity-risk-write-interval", "1")

    for node in risky:
        revoke(devcluster, node)
    eventually(
        lambda: revocations(devcluster, risk_configmap, "p3.8xlarge") >= 1.99,
        what="the two notices counted in the ConfigMap",
    )
    for node in risky:
        back(devcluster, node)

    first = pods.gang("first", 2, gpus=4, min_member=2)
    placed = eventually(
        lambda: pods.bound(first) if len(pods.bound(first)) == 2 else None,
        what="the first gang's quorum",
    )
    assert set(placed.values()) <= set(safe), placed

    # A new scheduler process (the old one stopped): it reads the counts back.
    assert first_process.stop() == 0
    start_scheduler("--capacity-risk-write-interval", "1")
    second = pods.gang("second", 2, gpus=4, min_member=2)
    placed = eventually(
        lambda: pods.bound(second) if len(pods.bound(second)) == 2 else None,
        what="the second gang's quorum, after the restart",
    )
    assert set(placed.values()) <= set(safe), placed
    assert revocations(devcluster, risk_configmap, "p3.8xlarge") > 1.9


@pytest.mark.usefixtures("risk_configmap")
def test_a_bound_on_the_quorum_risk_keeps_a_gang_waiting_and_says_why(
    devcluster: Devcluster,
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    tmp_path: Any,
) -> None:
    # Only the risky pool exists, seeded by the operator at 0.5 revocations per node-hour: a
    # quorum of two there risks 63% of losing a member within an hour, above the gang's 10%.
    risky = pool.add(
        2,
        gpus=4,
        prefix="only",
        spot_fraction=1.0,
        extra_labels={INSTANCE_TYPE_LABEL: "p3.2xlarge"},
    )
    zone = devcluster.core().read_node(risky[0]).metadata.labels[names.ZONE_LABEL]
    seed = tmp_path / "seed.json"
    seed.write_text(
        json.dumps([{"instanceType": "p3.2xlarge", "zone": zone, "revocationsPerHour": 0.5}])
    )
    start_scheduler("--capacity-risk-seed", str(seed))
    members = pods.gang(
        "careful", 2, gpus=4, min_member=2, annotations={MAX_QUORUM_RISK_ANNOTATION: "10%"}
    )

    def told() -> str | None:
        # The first condition may say the gang still lacks its second member.
        condition = pods.condition(members[0])
        message = condition.message if condition is not None else None
        return message if message and MAX_QUORUM_RISK_ANNOTATION in message else None

    message = eventually(told, what="the waiting gang's condition to name the bound")
    assert "risks 63.2% of losing one within an hour, above the 10.0%" in message
    assert MAX_QUORUM_RISK_ANNOTATION in message
    assert pods.bound(members) == {}
    command = [sys.executable, "-m", "shoalctl", "--kubeconfig", devcluster.kubeconfig]
    command += ["--scheduler-name", pods.scheduler, "why", "careful", "-n", pods.namespace]
    why = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=120, check=True)
    assert "above the 10.0% shoal.dev/max-quorum-risk allows" in why.stdout
