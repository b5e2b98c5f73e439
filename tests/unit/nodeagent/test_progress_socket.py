"""Progress reports over the real notice socket (protocol 0.2.0): the wire codec between the
worker library and the agent, the agent writing a pod's report on it, the same identity rules
as an acknowledgement, and a new worker against an agent older than 0.2.0."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from shoal_worker import NoticeClient, NoticeRefused, PodIdentity, Report
from shoal_worker.progress import request
from shoal_worker.protocol import notices_pb2 as pb

from contracts.progress import Progress, ProgressError, decode
from nodeagent.core.events import PodUid
from nodeagent.notify.server import progress_of
from tests.unit.nodeagent.notice_socket import PODS, SocketAgent, identity

NOW = 1_800_000_000.0


def test_a_report_crosses_the_wire_as_the_document_the_scheduler_reads() -> None:
    sent = Report(1234, 0.8, 1000, NOW - 95.5, 40.0)
    received = progress_of(
        pb.ProgressRequest.FromString(request(pb.PodIdentity(), sent).SerializeToString()), NOW
    )
    assert received == Progress(
        step=1234,
        step_seconds=0.8,
        checkpoint_step=1000,
        checkpoint_at=float(int(NOW - 95.5)),  # the document keeps whole seconds
        checkpoint_seconds=40.0,
        reported_at=NOW,
    )
    assert received.steps_at_risk() == 234


def test_no_checkpoint_yet_crosses_as_none() -> None:
    received = progress_of(request(pb.PodIdentity(), Report(7, 1.5)), NOW)
    assert (received.checkpoint_step, received.checkpoint_at) == (0, None)


@pytest.mark.parametrize(
    ("wire", "field"),
    [
        (pb.ProgressRequest(step=-1), "step"),
        (pb.ProgressRequest(step=5, checkpoint_step=6), "checkpointStep"),
        (pb.ProgressRequest(step=5, step_seconds=float("nan")), "step_seconds"),
        (pb.ProgressRequest(step=5, checkpoint_seconds=float("inf")), "checkpoint_seconds"),
        (pb.ProgressRequest(step=5, checkpoint_seconds=1e9), "checkpointSeconds"),
        (pb.ProgressRequest(step=5, checkpoint_unix_ms=-5), "checkpoint_unix_ms"),
        (pb.ProgressRequest(step=5, checkpoint_unix_ms=2**62), "checkpoint_unix_ms"),
    ],
)
def test_the_agent_refuses_a_report_naming_the_field(wire: pb.ProgressRequest, field: str) -> None:
    with pytest.raises(ProgressError, match=field):
        progress_of(wire, NOW)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SocketAgent]:
    agent = SocketAgent(tmp_path / "agent.sock")
    agent.start()
    yield agent
    agent.stop()


def client(node: SocketAgent, index: int = 0, uid: str | None = None) -> NoticeClient:
    ns, name, own = PODS[index]
    return NoticeClient(PodIdentity(ns, name, uid or own), node.socket_path)


def test_a_report_is_written_on_the_pod_at_once_and_a_burst_waits_for_the_newest(
    node: SocketAgent,
) -> None:
    worker = client(node)
    assert asyncio.run(worker.report_progress(Report(100, 0.5, 50, NOW, 20.0)))
    node.until(lambda: node.cluster.progress, "the report written on the pod")
    [(pod, text)] = node.cluster.progress
    assert pod == "train/worker-0"
    written = decode(text)
    assert (written.step, written.checkpoint_step, written.checkpoint_seconds) == (100, 50, 20.0)
    for step in range(101, 111):
        assert asyncio.run(worker.report_progress(Report(step, 0.5, 50, NOW, 20.0)))
    waiting = node.a.progress.ledger.waiting(PodUid(PODS[0][2]))
    assert waiting is not None
    assert waiting.step == 110  # the newest, written when the minute is up
    assert len(node.cluster.progress) == 1
    written_total = node.a.metrics.registry.get_sample_value(
        "shoal_agent_progress_writes_total", {"result": "written"}
    )
    assert written_total == 1


def test_only_a_pod_on_the_node_under_its_own_uid_can_report(node: SocketAgent) -> None:
    forged = client(node, 0, uid=PODS[1][2])
    with pytest.raises(NoticeRefused, match="not-on-node"):
        asyncio.run(forged.report_progress(Report(1)))
    stranger = NoticeClient(PodIdentity("train", "worker-7", "x"), node.socket_path)
    with pytest.raises(NoticeRefused, match="not-on-node"):
        asyncio.run(stranger.report_progress(Report(1)))
    with pytest.raises(NoticeRefused, match="checkpointStep"):
        asyncio.run(client(node).report_progress(Report(1, checkpoint_step=2)))
    assert node.cluster.progress == []
    assert len(node.a.progress.ledger) == 0


def test_an_old_style_worker_still_hears_its_notice_beside_a_reporting_one(
    node: SocketAgent,
) -> None:
    ns, name, uid = PODS[1]
    assert asyncio.run(client(node, 0).report_progress(Report(3)))
    watch = node.stub.Watch(pb.WatchRequest(pod=identity(ns, name, uid)), timeout=5)
    assert next(watch).state == pb.Notice.NONE
    watch.cancel()


def old_agent(path: Path) -> grpc.Server:
    """A 0.1.0 agent: Watch and Acknowledge only (its service knows no Progress method)."""

    def acknowledge(request: pb.AcknowledgeRequest, context: object) -> pb.AcknowledgeReply:
        return pb.AcknowledgeReply(accepted=False, detail="not-under-notice")

    server = grpc.server(futures.ThreadPoolExecutor(2))
    handler = grpc.method_handlers_generic_handler(
        "shoal.v1.Notices",
        {
            "Acknowledge": grpc.unary_unary_rpc_method_handler(
                acknowledge,
                request_deserializer=pb.AcknowledgeRequest.FromString,
                response_serializer=pb.AcknowledgeReply.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix:{path}")
    server.start()
    return server


def test_a_new_worker_against_an_old_agent_stops_reporting_with_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = old_agent(tmp_path / "old.sock")
    try:
        worker = NoticeClient(PodIdentity(*PODS[0]), str(tmp_path / "old.sock"))
        with caplog.at_level(logging.INFO, logger="shoal_worker"):
            assert asyncio.run(worker.report_progress(Report(1))) is False
            assert asyncio.run(worker.report_progress(Report(2))) is False
        lines = [r for r in caplog.records if "progress" in r.getMessage()]
        assert len(lines) == 1
        assert "0.2.0" in lines[0].getMessage()
        # The calls it always had still work.
        with pytest.raises(NoticeRefused, match="not-under-notice"):
            asyncio.run(worker.acknowledge(5))
    finally:
        server.stop(0)
