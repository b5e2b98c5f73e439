"""Least-loss reclaim and early warnings, with the real scheduler on the devcluster.

Each test writes the members' ``shoal.dev/progress`` itself, as their node agent would, and
reads what the scheduler decided from the API server: which pod got ``shoal.dev/leave-by``, and
the ``Reclaimed`` Event that says why (docs/architecture.md, "Progress and least-loss
reclaim")."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from contracts import names
from contracts.progress import Progress, encode
from contracts.times import parse_time
from nodeagent.adapters.k8s import encode_revocation
from nodeagent.core.events import EventId, Kind, Notice, Tracked
from scheduler.loss import PATIENCE_ANNOTATION
from tests.integration.scheduler.conftest import Pods, Pool, SchedulerProcess, ensure_priority_class
from tests.waiting import eventually

HIGH = "shoal-test-high"
#: Long enough that no victim is evicted while a test looks (the tests that need it go set less).
GRACE = "600"


def report(pods: Pods, name: str, *, step: int, checkpoint_step: int) -> None:
    """Write ``name``'s progress as its node agent would: one step a second, the checkpoint
    ``step - checkpoint_step`` seconds ago."""
    now = time.time()
    document = encode(
        Progress(
            step=step,
            step_seconds=1.0,
            checkpoint_step=checkpoint_step,
            checkpoint_at=now - (step - checkpoint_step),
            checkpoint_seconds=20.0,
            reported_at=now,
        )
    )
    body = {"metadata": {"annotations": {names.PROGRESS_ANNOTATION: document}}}
    pods.devcluster.core().patch_namespaced_pod(name, pods.namespace, body)


def leave_by(pods: Pods, name: str) -> str | None:
    notes = pods.read(name).metadata.annotations or {}
    return notes.get(names.LEAVE_BY_ANNOTATION)


def asked(pods: Pods, members: list[str]) -> list[str]:
    return [m for m in members if leave_by(pods, m) is not None]


def reclaimed_event(pods: Pods, name: str) -> str | None:
    """The message of the scheduler's ``Reclaimed`` Event on ``name``, once there is one."""
    for event in pods.events(name):
        if event.reason == "Reclaimed":
            return str(event.message)
    return None


def running_gang(
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    count: int,
    *extra: str,
) -> tuple[dict[str, str], SchedulerProcess]:
    """An elastic gang (minimum 1) with ``count`` members of 8 GPUs bound, one per node, on
    three nodes; returns member -> node, and the scheduler."""
    ensure_priority_class(pods.devcluster, HIGH, 100000)
    pool.add(3, gpus=8)
    members = pods.gang("elastic", count, gpus=8, min_member=1, max_member=count)
    scheduler = start_scheduler(*extra)
    placed = eventually(
        lambda: found if len(found := pods.bound(members)) == count else None,
        what="the elastic gang at its maximum",
    )
    return placed, scheduler


def waits_for_checkpoint(scheduler: SchedulerProcess, pods: Pods, name: str) -> bool:
    """The scheduler chose ``name`` and waits for its next checkpoint (its log says so)."""
    key = f"{pods.namespace}/{name}"
    return any(
        line.get("event") == "reclaim_waits_for_checkpoint" and line.get("pod") == key
        for line in scheduler.log_lines()
    )


def test_the_reclaim_victim_is_the_member_with_the_newest_checkpoint(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    placed, _ = running_gang(pool, pods, start_scheduler, 3, "--reclaim-grace", GRACE)
    # Otherwise equal (same shape, same priority); elastic-2 is the youngest, the one taken
    # without reports. elastic-1 checkpointed 30 s ago: it loses the least.
    report(pods, "elastic-0", step=2000, checkpoint_step=1100)
    report(pods, "elastic-1", step=2000, checkpoint_step=1970)
    report(pods, "elastic-2", step=2000, checkpoint_step=1400)
    pods.gang("urgent", 1, gpus=8, min_member=1, priority_class=HIGH)

    message = eventually(lambda: reclaimed_event(pods, "elastic-1"), what="elastic-1 reclaimed")
    assert asked(pods, list(placed)) == ["elastic-1"]
    assert "least expected loss" in message
    assert "since its checkpoint at step 1970" in message
    assert f"{pods.namespace}/elastic-2" in message  # the next candidate spared


def test_patience_waits_for_the_victims_next_checkpoint(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    _, scheduler = running_gang(pool, pods, start_scheduler, 3, "--reclaim-grace", GRACE)
    report(pods, "elastic-0", step=2000, checkpoint_step=1100)
    report(pods, "elastic-1", step=2000, checkpoint_step=1970)
    report(pods, "elastic-2", step=2000, checkpoint_step=1400)
    pods.gang(
        "urgent",
        1,
        gpus=8,
        min_member=1,
        priority_class=HIGH,
        annotations={PATIENCE_ANNOTATION: "600"},
    )
    eventually(lambda: waits_for_checkpoint(scheduler, pods, "elastic-1"), what="elastic-1 chosen")
    # Chosen, not asked: no leave-by until its checkpoint, and nobody else taken meanwhile.
    assert asked(pods, ["elastic-0", "elastic-1", "elastic-2"]) == []

    report(pods, "elastic-1", step=2030, checkpoint_step=2030)
    message = eventually(lambda: reclaimed_event(pods, "elastic-1"), what="elastic-1 reclaimed")
    assert "asked at its new checkpoint (step 2030)" in message
    assert asked(pods, ["elastic-0", "elastic-1", "elastic-2"]) == ["elastic-1"]


def test_patience_runs_out_without_a_new_checkpoint(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    running_gang(pool, pods, start_scheduler, 3, "--reclaim-grace", GRACE)
    report(pods, "elastic-0", step=2000, checkpoint_step=1100)
    report(pods, "elastic-1", step=2000, checkpoint_step=1970)
    report(pods, "elastic-2", step=2000, checkpoint_step=1400)
    patience = 4.0
    pods.gang(
        "urgent",
        1,
        gpus=8,
        min_member=1,
        priority_class=HIGH,
        annotations={PATIENCE_ANNOTATION: str(patience)},
    )
    created = pods.read("urgent-0").metadata.creation_timestamp.timestamp()
    message = eventually(lambda: reclaimed_event(pods, "elastic-1"), what="elastic-1 reclaimed")
    assert "no new checkpoint by" in message
    written = leave_by(pods, "elastic-1")
    assert written is not None
    # Asked no sooner than the patience after the gang appeared (times in whole seconds).
    assert parse_time(written).timestamp() >= created + patience + float(GRACE) - 1


def rebalance_recommendation(core: Any, node_name: str) -> None:
    """What the node agent writes on its node for an AWS rebalance recommendation: the
    ``shoal.dev/revocation`` annotation with a notice that is not disruptive, and its taint."""
    now = datetime.now(UTC)
    notice = Notice(
        event_id=EventId("aws-rebalance"),
        source="aws",
        channel="aws/rebalance",
        kind=Kind.REBALANCE,
        deadline=now + timedelta(minutes=30),
        reason="EC2 rebalance recommendation: elevated risk of interruption",
        disruptive=False,
    )
    node = core.read_node(node_name)
    taint = {"key": names.REVOKING_TAINT, "value": "aws", "effect": "NoSchedule"}
    body = {
        "metadata": {
            "annotations": {names.REVOCATION_ANNOTATION: encode_revocation([Tracked(notice, now)])}
        },
        "spec": {"taints": [*(node.spec.taints or []), taint]},
    }
    core.patch_node(node_name, body)


@pytest.mark.parametrize("warning", ["cordon", "karpenter", "rebalance"])
def test_an_early_warning_moves_the_surplus_member_before_any_notice(
    warning: str, pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    """No node agent runs here and no termination notice exists: only the cordon,
    Karpenter's taint, or what the agent writes for a rebalance recommendation (a notice
    that is not disruptive)."""
    placed, scheduler = running_gang(pool, pods, start_scheduler, 2, "--reclaim-grace", "2")
    mover, stays = "elastic-1", "elastic-0"
    warned = placed[mover]
    core = pods.devcluster.core()
    if warning == "cordon":
        # It reports progress: it leaves at its next checkpoint.
        report(pods, mover, step=500, checkpoint_step=480)
        core.patch_node(warned, {"spec": {"unschedulable": True}})
        why = "(cordoned)"
    elif warning == "karpenter":
        # It reports none: it leaves at once.
        node = core.read_node(warned)
        taints = [
            *(node.spec.taints or []),
            {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"},
        ]
        core.patch_node(warned, {"spec": {"taints": taints}})
        why = "(taint karpenter.sh/disrupted)"
    else:
        rebalance_recommendation(core, warned)
        why = "(rebalance: EC2 rebalance recommendation"
    if warning == "cordon":
        # The scheduler saw the cordon and waits for the member's checkpoint: no leave-by yet.
        eventually(lambda: waits_for_checkpoint(scheduler, pods, mover), what="mover chosen")
        assert leave_by(pods, mover) is None
        report(pods, mover, step=510, checkpoint_step=510)

    message = eventually(lambda: reclaimed_event(pods, mover), what="the surplus member asked")
    assert f"node {warned} is expected to go {why}" in message
    assert (
        "asked at its new checkpoint (step 510)" in message
        if warning == "cordon"
        else "asked at once" in message
    )
    assert leave_by(pods, stays) is None  # the gang keeps its minimum where it is
    eventually(lambda: _gone(pods, mover), what="the member evicted at its leave-by")

    # Its controller creates the replacement; it binds elsewhere, never on the warned node.
    pods.create(
        "elastic-2",
        gpus=8,
        labels={names.GANG_LABEL: "elastic"},
        annotations={names.MIN_MEMBER_ANNOTATION: "1", names.MAX_MEMBER_ANNOTATION: "2"},
    )
    node = eventually(lambda: pods.node_of("elastic-2"), what="the replacement bound")
    assert node not in (warned, placed[stays])


def _gone(pods: Pods, name: str) -> bool:
    try:
        pod: Any = pods.read(name)
    except Exception as exc:  # 404: gone
        return getattr(exc, "status", None) == 404
    return pod.metadata.deletion_timestamp is not None
