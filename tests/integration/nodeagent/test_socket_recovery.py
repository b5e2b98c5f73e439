"""The notice socket's folder removed under a running agent (a node clean-up, a tmpfs mounted
again, a hostPath made anew): the agent serves the socket again within a couple of seconds, a
worker started afterwards (the real worker CLI) hears its notice, and so does the worker that
was connected before."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakes import metadata
from tests import figures
from tests.integration.conftest import Devcluster
from tests.integration.nodeagent.harness import Worker, eventually
from tests.integration.nodeagent.test_agent import Scene, make_scene

pytestmark = pytest.mark.reliability

SECTION = "agent notice socket removed"


@pytest.fixture
def socket_scene(devcluster: Devcluster, namespace: str, tmp_path: Path) -> Iterator[Scene]:
    """An AWS node whose agent serves its socket in a folder of its own (``run/shoal``), apart
    from the agent's logs and state."""
    socket_path = tmp_path / "run" / "shoal" / "agent.sock"
    servers = metadata.Threaded()
    try:
        extra = ["--socket", str(socket_path)]
        yield from make_scene(devcluster, namespace, servers, tmp_path, "aws", extra=extra)
    finally:
        servers.close()


def test_a_removed_socket_folder_is_served_again_to_new_and_connected_workers(
    socket_scene: Scene, tmp_path: Path
) -> None:
    scene = socket_scene
    folder = tmp_path / "run"
    socket_path = folder / "shoal" / "agent.sock"
    pod = scene.pods["trainer-0"]
    connected = Worker(pod, str(socket_path))
    waiting: subprocess.Popen[str] | None = None
    fresh: Worker | None = None
    try:
        assert connected.next().state == "none"
        removed = time.monotonic()
        shutil.rmtree(folder)

        # How long the agent may take is asserted below; this only waits for it.
        eventually(socket_path.exists, timeout=60, what=f"{socket_path} to be served again")
        served = time.monotonic()
        # A new worker (the client library in this process, so that a worker process's own
        # start-up, seconds on a loaded machine, is not counted as the agent's) watches through
        # the new socket.
        fresh = Worker(pod, str(socket_path))
        assert fresh.next().state == "none"
        watching = time.monotonic()
        assert watching - removed < 5
        env = {
            **os.environ,
            "POD_NAMESPACE": pod.namespace,
            "POD_NAME": pod.name,
            "POD_UID": pod.uid,
            "SHOAL_SOCKET": str(socket_path),
        }
        waiting = subprocess.Popen(
            [sys.executable, "-m", "nodeagent.client", "wait"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # Three watches open: the worker CLI reached the agent through the new socket too.
        eventually(
            lambda: scene.agent.status()["watchers"] == 3 or waiting.poll() is not None,
            timeout=60,
            what="the worker CLI's watch",
        )
        assert waiting.poll() is None, waiting.communicate()

        scene.cloud.post()
        out, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 0, err
        heard = json.loads(out)
        assert heard["source"] == "aws"
        assert connected.until("leave").event_id == heard["event_id"]
        assert fresh.until("leave").event_id == heard["event_id"]
    finally:
        if waiting is not None:
            waiting.kill()
            # Reaped and its pipes closed here: left to the garbage collector, a failure here
            # became an unraisable-exception error in whichever test ran next on this worker.
            waiting.communicate()
        if fresh is not None:
            fresh.close()
        connected.close()

    recreated = [e for e in scene.agent.log_lines() if e.get("event") == "notice_socket_recreated"]
    assert [(e["level"], e["path"], e["reason"], e["folder_recreated"]) for e in recreated] == [
        ("warning", str(socket_path), "removed", True)
    ]
    assert 'shoal_agent_socket_recreated_total{reason="removed"} 1.0' in scene.agent.metrics()
    code, health = scene.agent.get("/healthz")
    assert code == 200
    assert health["notice_socket"]["serving"] is True
    figures.record(SECTION, "removal to the socket served again (s)", served - removed)
    figures.record(SECTION, "removal to a new worker watching (s)", watching - removed)


def test_a_socket_that_cannot_be_served_again_fails_healthz_with_the_reason(
    socket_scene: Scene, tmp_path: Path
) -> None:
    scene = socket_scene
    shoal = tmp_path / "run" / "shoal"
    shutil.rmtree(shoal)
    shoal.write_text("a file where the socket's folder was")

    def unhealthy() -> dict[str, object] | None:
        code, body = scene.agent.get("/healthz")
        return body if code == 503 else None

    body = eventually(unhealthy, timeout=10, what="/healthz to fail")
    problem = body["notice_socket"]["problem"]  # type: ignore[index]
    assert str(problem).startswith(f"cannot serve {shoal / 'agent.sock'} again: ")
    assert (
        eventually(
            lambda: [
                e for e in scene.agent.log_lines() if e.get("event") == "notice_socket_unserved"
            ],
            timeout=10,
            what="the log to say why",
        )[0]["problem"]
        == problem
    )
