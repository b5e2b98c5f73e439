"""The worker library's former name keeps working, silently: a training image built before it
became ``shoal-worker`` imports ``nodeagent.client`` and runs ``python -m nodeagent.client``,
and the agent's own image and the real-node tests run the latter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import shoal_worker
import shoal_worker.distributed

import nodeagent.client
import nodeagent.client.distributed

ROOT = Path(__file__).resolve().parents[3]


def test_the_former_names_are_the_same_objects() -> None:
    for name in nodeagent.client.__all__:
        assert getattr(nodeagent.client, name) is getattr(shoal_worker, name)
    for name in nodeagent.client.distributed.__all__:
        former = getattr(nodeagent.client.distributed, name)
        assert former is getattr(shoal_worker.distributed, name)


def test_the_former_command_runs_without_a_warning(tmp_path: Path) -> None:
    pod = ["--namespace", "train", "--name", "w-0", "--uid", "u-0"]
    socket = ["--socket", str(tmp_path / "absent.sock")]
    refused = subprocess.run(
        [sys.executable, "-W", "error", "-m", "nodeagent.client", *pod, *socket, "ack", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode == 4, refused.stderr  # the agent is unreachable: exit 4
    assert "agent unreachable" in refused.stderr
    assert "Warning" not in refused.stderr
