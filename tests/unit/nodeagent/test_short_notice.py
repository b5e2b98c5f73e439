"""A notice shorter than a pod's checkpoint, through the agent's rooms: the pod that declares a
longer checkpoint gets a Warning Event and a log line with both figures; the agent goes on."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from shoal_worker.watcher import LeaveNotice, short_notice
from structlog.testing import capture_logs

from nodeagent.wiring.executor import SHORT_NOTICE_REASON
from tests.unit.nodeagent.notice_socket import PODS, SocketAgent, notice


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SocketAgent]:
    agent = SocketAgent(tmp_path / "agent.sock")
    slow, quick = agent.cluster.pods
    agent.cluster.pods = [
        replace(slow, checkpoint_seconds=600),
        replace(quick, checkpoint_seconds=5),
    ]
    agent.start()
    yield agent
    agent.stop()


def test_only_the_pod_whose_checkpoint_is_longer_than_the_notice_is_warned(
    node: SocketAgent,
) -> None:
    (ns, slow, _), _ = PODS
    with capture_logs() as logs:
        node.observe([notice(lead=timedelta(minutes=2))])
        node.settle()
    [(pod, reason, message)] = node.cluster.warned
    assert (pod, reason) == (f"{ns}/{slow}", SHORT_NOTICE_REASON)
    given = re.match(r"The notice gives (\d+) s \(leave by \S+, aws terminate\) but", message)
    assert given is not None, message
    assert 110 <= int(given.group(1)) <= 120, message
    assert "the checkpoint takes 600 s (shoal.dev/checkpoint-seconds)" in message
    assert message.endswith("the work since the pod's last complete checkpoint will be lost")
    [line] = [e for e in logs if e["event"] == "notice_shorter_than_checkpoint"]
    assert (line["pod"], line["checkpoint_seconds"]) == (f"{ns}/{slow}", 600)
    assert line["given_seconds"] == int(given.group(1))
    # The agent goes on as for any notice: both pods are under notice and may acknowledge.
    assert node.acked() == {f"{ns}/{name}": None for _, name, _ in PODS}
    assert all(r["notified"] for r in node.a.store.pod_report())


NOW = datetime(2026, 11, 30, 10, 0, 0, tzinfo=UTC)
LEAVE = LeaveNotice(state="leave", source="aws", leave_by=NOW + timedelta(seconds=5.7))


def test_the_worker_says_which_steps_a_short_notice_loses() -> None:
    assert short_notice(LEAVE, NOW, 20, 47, 41) == (
        "notice gives 5 s, checkpoint takes 20 s: unless the checkpoint of step 47 completes "
        "sooner, steps after 41 (the last checkpoint) will be lost"
    )
    assert short_notice(LEAVE, NOW, 20, 47, -1) == (
        "notice gives 5 s, checkpoint takes 20 s: unless the checkpoint of step 47 completes "
        "sooner, steps 0 to 47 will be lost (no checkpoint yet)"
    )
    unknown = short_notice(LEAVE, NOW, 7.5, 47, None)
    assert unknown is not None
    assert unknown.endswith(
        "7.5 s: unless the checkpoint of step 47 completes sooner, the steps "
        "after the last checkpoint will be lost"
    )


def test_the_worker_says_nothing_when_the_notice_is_long_enough_or_nothing_is_known() -> None:
    assert short_notice(LEAVE, NOW, 5, 47, 41) is None
    assert short_notice(LEAVE, NOW, None, 47, 41) is None
    assert short_notice(None, NOW, 20, 47, 41) is None
    no_deadline = LeaveNotice(state="leave", source="annotation", leave_by=None)
    assert short_notice(no_deadline, NOW, 20, 47, 41) is None
