"""The notice socket removed or replaced under a running agent: it is served again at its path
(its folder made again as at start-up), workers already connected keep hearing notices, and
when it cannot be served again ``/healthz`` says why."""

from __future__ import annotations

import os
import shutil
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from shoal_worker.protocol import notices_pb2 as pb
from shoal_worker.protocol import rpc
from structlog.testing import capture_logs

from nodeagent.notify.server import NoticeServer, serve
from nodeagent.notify.socketfile import Change, FileId, Folder, change, listening
from nodeagent.wiring.agent import Agent
from tests.unit.nodeagent.notice_socket import PODS, SocketAgent, identity, notice

pytestmark = pytest.mark.reliability


# -- the file-level steps ------------------------------------------------------------------


def test_a_check_tells_the_served_socket_from_a_removed_or_replaced_one() -> None:
    served = FileId(device=1, inode=10)
    assert change(served, FileId(device=1, inode=10)) is None
    assert change(served, None) is Change.REMOVED
    assert change(served, FileId(device=1, inode=11)) is Change.REPLACED
    # A tmpfs mounted again reuses inode numbers on another device.
    assert change(served, FileId(device=2, inode=10)) is Change.REPLACED
    # Serving nothing (a failed bind), any file there is to be replaced.
    assert change(None, FileId(device=1, inode=10)) is Change.REPLACED


def test_the_folder_is_made_again_with_its_start_up_mode(tmp_path: Path) -> None:
    path = tmp_path / "run" / "shoal"
    path.mkdir(parents=True)
    os.chmod(path, 0o2770)
    folder = Folder.made(path)
    assert folder.restore() is False  # still there: left alone
    shutil.rmtree(tmp_path / "run")
    assert folder.restore() is True
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o2770


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may give a folder another owner")
def test_the_folder_is_made_again_with_its_start_up_owner_and_group(tmp_path: Path) -> None:
    path = tmp_path / "shoal"
    path.mkdir()
    os.chown(path, 65532, 65533)
    folder = Folder.made(path)
    path.rmdir()
    assert folder.restore() is True
    made = os.stat(path)
    assert (made.st_uid, made.st_gid) == (65532, 65533)


def test_a_file_in_the_folders_place_is_an_error_not_a_folder(tmp_path: Path) -> None:
    path = tmp_path / "shoal"
    folder = Folder.made(path)
    path.rmdir()
    path.write_text("not a folder")
    with pytest.raises(FileExistsError):
        folder.restore()


def test_only_a_socket_someone_accepts_on_counts_as_served(tmp_path: Path) -> None:
    live = tmp_path / "live.sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(live))
        server.listen()
        assert listening(live)
    assert not listening(live)  # its process is gone: a stale file
    (tmp_path / "plain").write_text("")
    assert not listening(tmp_path / "plain")
    assert not listening(tmp_path / "missing")


# -- the agent's socket, served again ------------------------------------------------------


class Node(SocketAgent):
    """The agent on its socket, checked only when the test says so, with its metrics."""

    def start(self) -> None:
        async def start() -> Agent:
            agent = Agent(self.cluster, [], node_name="gpu-0")
            self._server = await serve(
                agent.service, self.socket_path, metrics=agent.metrics, check_every=3600
            )
            agent.start()
            return agent

        self.agent = self.call(start)
        self.channel = grpc.insecure_channel(f"unix:{self.socket_path}")
        self.stub = rpc.NoticesStub(self.channel)
        self.until(lambda: self.a.pods.restored, "the agent restored its state")

    def metric(self, name: str, **labels: str) -> float | None:
        return self.a.metrics.registry.get_sample_value(name, labels)

    @property
    def server(self) -> NoticeServer:
        found: NoticeServer = self._server
        return found

    def check(self, now: float | None = None) -> None:
        self.call(lambda: self.server.check(now))

    def worker(self) -> tuple[Any, Any]:
        """A new worker's watch of worker-0, on a connection of its own."""
        channel = grpc.insecure_channel(f"unix:{self.socket_path}")
        (ns, name, uid) = PODS[0]
        watch = rpc.NoticesStub(channel).Watch(
            pb.WatchRequest(pod=identity(ns, name, uid)), timeout=30
        )
        return channel, watch


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    agent = Node(tmp_path / "run" / "shoal" / "agent.sock")
    agent.start()
    yield agent
    agent.stop()


def test_a_removed_folder_is_served_again_and_old_and_new_workers_hear_the_notice(
    node: Node,
) -> None:
    (ns, name, uid) = PODS[0]
    before = node.stub.Watch(pb.WatchRequest(pod=identity(ns, name, uid)), timeout=30)
    assert next(before).state == pb.Notice.NONE
    shutil.rmtree(Path(node.socket_path).parent.parent)
    with capture_logs() as logs:
        node.check()
    assert [e for e in logs if e["event"] == "notice_socket_recreated"] == [
        {
            "event": "notice_socket_recreated",
            "log_level": "warning",
            "path": node.socket_path,
            "reason": "removed",
            "detail": "the socket file was removed (or its folder)",
            "folder_recreated": True,
            "after_problem": None,
        }
    ]
    channel, after = node.worker()
    try:
        assert next(after).state == pb.Notice.NONE
        node.observe([notice()])
        assert next(after).state == pb.Notice.LEAVE
        assert next(before).state == pb.Notice.LEAVE
    finally:
        after.cancel()
        before.cancel()
        channel.close()
    ok, detail = node.server.live()
    assert ok
    assert detail["recreated"] == 1
    assert node.metric("shoal_agent_socket_recreated_total", reason="removed") == 1
    assert node.metric("shoal_agent_socket_serving") == 1


def test_a_stale_file_in_the_sockets_place_is_replaced(node: Node) -> None:
    path = Path(node.socket_path)
    path.unlink()
    path.write_text("left by a clean-up script")
    node.check()
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    channel, watch = node.worker()
    try:
        assert next(watch).state == pb.Notice.NONE
    finally:
        watch.cancel()
        channel.close()
    assert node.metric("shoal_agent_socket_recreated_total", reason="replaced") == 1


def test_a_socket_that_cannot_be_served_again_fails_health_with_the_reason(node: Node) -> None:
    folder = Path(node.socket_path).parent
    shutil.rmtree(folder)
    folder.write_text("a file where the folder was")
    with capture_logs() as logs:
        node.check()
        node.check()  # the same problem is logged once
    ok, detail = node.server.live()
    assert not ok
    assert detail["serving"] is False
    assert str(detail["problem"]).startswith(f"cannot serve {node.socket_path} again: ")
    unserved = [e for e in logs if e["event"] == "notice_socket_unserved"]
    assert [(e["log_level"], e["path"]) for e in unserved] == [("error", node.socket_path)]
    assert node.metric("shoal_agent_socket_serving") == 0
    # Once the folder can be made again, the next check serves the socket.
    folder.unlink()
    node.check()
    ok, detail = node.server.live()
    assert ok
    assert detail["problem"] is None
    channel, watch = node.worker()
    try:
        assert next(watch).state == pb.Notice.NONE
    finally:
        watch.cancel()
        channel.close()


def test_a_socket_another_process_serves_at_the_path_is_not_taken_back(node: Node) -> None:
    path = Path(node.socket_path)
    path.unlink()
    with socket.socket(socket.AF_UNIX) as other:
        other.bind(str(path))
        other.listen()
        theirs = FileId.at(path)
        node.check()
        ok, detail = node.server.live()
        assert not ok
        assert "another process serves a socket" in str(detail["problem"])
        assert FileId.at(path) == theirs
    # That process gone, its file is stale: the agent serves the path again.
    node.check()
    assert node.server.live()[0]


def test_a_replaced_server_is_stopped_once_no_call_can_reach_it(node: Node) -> None:
    (ns, name, uid) = PODS[0]
    before = node.stub.Watch(pb.WatchRequest(pod=identity(ns, name, uid)), timeout=30)
    assert next(before).state == pb.Notice.NONE
    Path(node.socket_path).unlink()
    node.check()
    assert node.server.live()[1]["servers"] == 2
    # An open watch keeps the old server, however long it lasts.
    node.check(now=1e9)
    assert node.server.live()[1]["servers"] == 2
    before.cancel()

    def retired() -> bool:
        node.check(now=1e9)
        return bool(node.server.live()[1]["servers"] == 1)

    node.until(retired, "the old server was stopped once its watch closed")
    channel, watch = node.worker()
    try:
        assert next(watch).state == pb.Notice.NONE
    finally:
        watch.cancel()
        channel.close()


def test_a_stopped_agent_leaves_no_socket_behind(tmp_path: Path) -> None:
    agent = Node(tmp_path / "agent.sock")
    agent.start()
    Path(agent.socket_path).unlink()
    agent.check()
    agent.stop()
    # A worker finds no socket, and falls back to its leave-by file.
    assert sorted(p.name for p in tmp_path.iterdir()) == []
