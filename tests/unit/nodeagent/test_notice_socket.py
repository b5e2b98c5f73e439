"""The ack rules, over the real notice socket: only a pod's own ack, and only while it is under
a live notice, can make the agent evict it before its deadline."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from shoal_worker.protocol import notices_pb2 as pb
from structlog.testing import capture_logs

from tests.unit.nodeagent.notice_socket import PODS, SocketAgent, identity, notice

pytestmark = pytest.mark.reliability


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SocketAgent]:
    agent = SocketAgent(tmp_path / "agent.sock")
    agent.start()
    yield agent
    agent.stop()


def ack(
    node: SocketAgent, namespace: str, name: str, uid: str, step: int = 100
) -> pb.AcknowledgeReply:
    request = pb.AcknowledgeRequest(pod=identity(namespace, name, uid), step=step)
    reply: pb.AcknowledgeReply = node.stub.Acknowledge(request, timeout=5)
    return reply


def test_forged_acks_under_a_live_notice_evict_nobody_until_the_real_one(node: SocketAgent) -> None:
    (ns, w0, uid0), (_, w1, uid1) = PODS
    node.observe([notice()])
    node.settle()
    # Both workers are told: a watch of worker-0 shows the notice.
    watch = node.stub.Watch(pb.WatchRequest(pod=identity(ns, w0, uid0)), timeout=5)
    assert next(watch).state == pb.Notice.LEAVE
    watch.cancel()
    forged = [
        (ns, w0, uid1),  # worker-1 speaking for worker-0
        (ns, w0, "6f1c0a52-0000-4000-8000-00000000ffff"),  # an earlier incarnation
        (ns, "worker-7", "6f1c0a52-0000-4000-8000-000000000007"),  # a pod of another node
        ("other", w0, uid0),  # the right uid under another namespace
    ]
    for who in forged:
        reply = ack(node, *who)
        assert (reply.accepted, reply.detail) == (False, "not-on-node"), who
    node.settle()
    assert node.cluster.evicted == []
    assert node.acked() == {f"{ns}/{w0}": None, f"{ns}/{w1}": None}
    # The pod's own ack is what evicts it, at once, and only it.
    reply = ack(node, ns, w0, uid0)
    assert (reply.accepted, reply.detail) == (True, "accepted")
    node.until(lambda: node.cluster.evicted, "the acknowledged pod was evicted")
    assert node.cluster.evicted == [(f"{ns}/{w0}", "acknowledged")]


def test_an_ack_after_the_withdrawal_is_refused_and_evicts_nothing(node: SocketAgent) -> None:
    (ns, w0, uid0), _ = PODS
    node.observe([notice()])
    node.settle()
    node.observe([])
    reply = ack(node, ns, w0, uid0)
    assert (reply.accepted, reply.detail) == (False, "not-under-notice")
    node.settle()
    reply = ack(node, ns, w0, uid0)
    assert (reply.accepted, reply.detail) == (False, "not-under-notice")
    # A new notice finds no ack left over: nobody leaves before they are told and answer.
    node.observe([notice("spot-2")])
    node.settle()
    assert node.cluster.evicted == []


def test_a_call_without_an_identity_is_invalid_argument(node: SocketAgent) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        node.stub.Acknowledge(pb.AcknowledgeRequest(step=1), timeout=5)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "uid" in refused.value.details()
    with pytest.raises(grpc.RpcError) as unknown:
        next(node.stub.Watch(pb.WatchRequest(pod=identity("a", "b", "c")), timeout=5))
    assert unknown.value.code() is grpc.StatusCode.NOT_FOUND
    assert "not on this node" in unknown.value.details()


def test_an_undecodable_request_is_invalid_argument_not_a_traceback(node: SocketAgent) -> None:
    """Left to gRPC it was UNKNOWN, with the Python exception as the detail and a traceback
    in the agent's log for every such call."""
    with pytest.raises(grpc.RpcError) as ack_refused:
        node.channel.unary_unary("/shoal.v1.Notices/Acknowledge")(b"\xff\xff\xff", timeout=5)
    watch = node.channel.unary_stream("/shoal.v1.Notices/Watch")(b"\xff\xff\xff", timeout=5)
    with pytest.raises(grpc.RpcError) as watch_refused:
        next(watch)
    for refused in (ack_refused, watch_refused):
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "not a shoal.v1." in refused.value.details()


def test_an_identity_longer_than_kubernetes_allows_is_refused_unlogged(node: SocketAgent) -> None:
    (ns, w0, uid0), _ = PODS
    long, huge = "x" * 1_000, "x" * 100_000
    with capture_logs() as logs:
        for who in ((long, w0, uid0), (ns, long, uid0), (ns, w0, long)):
            with pytest.raises(grpc.RpcError) as refused:
                ack(node, *who)
            assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "at most 63 characters" in refused.value.details()
        # A request larger than any identity could make is not even read.
        for who in ((huge, w0, uid0), (ns, huge, uid0), (ns, w0, huge)):
            with pytest.raises(grpc.RpcError) as refused:
                ack(node, *who)
            assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "larger than max" in refused.value.details()
    assert not any(long in str(line) for line in logs)
