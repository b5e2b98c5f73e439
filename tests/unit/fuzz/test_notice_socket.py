"""Whatever a process on the node sends to the notice socket — garbage pod identities, any
step, bytes that are not a request, bytes that are not gRPC — the agent keeps serving, answers
every gRPC call with a clear status, and neither evicts nor acknowledges anybody for it."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from shoal_worker.protocol import notices_pb2 as pb

from tests.unit.fuzz.cases import Cases, search
from tests.unit.nodeagent.notice_socket import PODS, SocketAgent, identity, notice

pytestmark = pytest.mark.reliability

ACK = "/shoal.v1.Notices/Acknowledge"
WATCH = "/shoal.v1.Notices/Watch"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: What a refusal may be: the call named no pod, no such pod here, an undecodable request.
REFUSALS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
REAL = {(ns, name, uid) for ns, name, uid in PODS}

parts = st.one_of(
    st.sampled_from(["", " ", "train", "worker-0", "worker-1", "../..", "train/worker-0", "\x00"]),
    st.sampled_from([uid for _, _, uid in PODS]),
    st.text(max_size=40),
    st.text(st.characters(min_codepoint=0x80, exclude_categories=["Cs"]), max_size=40),
    st.integers(1_000, 300_000).map(lambda n: "é" * n),
)
identities = st.tuples(parts, parts, parts).filter(lambda who: who not in REAL)
steps = st.integers(-(2**63), 2**63 - 1)
calls = st.one_of(
    st.tuples(st.just("ack"), identities, steps),
    st.tuples(st.just("watch"), identities, st.just(0)),
    st.tuples(st.sampled_from([ACK, WATCH]), st.binary(max_size=300), st.just(0)),
    st.tuples(st.just("socket"), st.binary(max_size=300).map(lambda b: PREFACE + b), st.just(0)),
    st.tuples(st.just("socket"), st.binary(max_size=300), st.just(0)),
)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SocketAgent]:
    agent = SocketAgent(tmp_path / "agent.sock")
    agent.start()
    yield agent
    agent.stop()


def refused(error: grpc.RpcError) -> None:
    code, details = error.code(), error.details()
    assert code in REFUSALS, (code, details)
    assert details, f"{code} without a word of why"
    assert details.strip(), f"{code} without a word of why"


def send(node: SocketAgent, op: str, arg: Any, step: int) -> None:
    """One hostile call; every answer is a refusal with a status, or a refusal in the reply."""
    if op == "socket":
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
            raw.settimeout(0.2)
            raw.connect(node.socket_path)
            with contextlib.suppress(OSError):
                raw.sendall(arg)
                raw.recv(4096)
        return
    try:
        if op == "ack":
            request = pb.AcknowledgeRequest(pod=identity(*arg), step=step)
            reply = node.stub.Acknowledge(request, timeout=10)
        elif op == "watch":
            next(node.stub.Watch(pb.WatchRequest(pod=identity(*arg)), timeout=10))
            pytest.fail(f"a watch was opened for {arg!r}")
        elif op == ACK:
            raw_reply = node.channel.unary_unary(op)(arg, timeout=10)
            reply = pb.AcknowledgeReply.FromString(raw_reply)
        else:
            next(node.channel.unary_stream(op)(arg, timeout=10))
            pytest.fail(f"a watch was opened for bytes {arg!r}")
    except grpc.RpcError as error:
        refused(error)
        return
    assert not reply.accepted, (op, arg)
    assert reply.detail in ("not-on-node", "not-under-notice")


def test_notice_socket(node: SocketAgent) -> None:
    cases = Cases("notice socket")
    (ns, w0, uid0), _ = PODS
    node.observe([notice()])
    node.settle()
    started = time.monotonic()

    @search(1500)
    @given(calls)
    def run(call: tuple[str, Any, int]) -> None:
        cases()
        send(node, *call)

    run()
    node.settle()
    elapsed = time.monotonic() - started
    # Nothing was acknowledged, evicted or deleted; no task of the agent crashed.
    assert set(node.acked().values()) == {None}
    assert (node.cluster.evicted, node.cluster.deleted) == ([], [])
    assert node.a.guard.crashes == {}
    assert node.a.reports.live()[0]
    # And it still serves the pods that are there: a watch, then an ack that evicts.
    watch = node.stub.Watch(pb.WatchRequest(pod=identity(ns, w0, uid0)), timeout=5)
    assert next(watch).state == pb.Notice.LEAVE
    watch.cancel()
    reply = node.stub.Acknowledge(pb.AcknowledgeRequest(pod=identity(ns, w0, uid0), step=1))
    assert reply.accepted
    node.until(lambda: node.cluster.evicted, "the acknowledged pod was evicted")
    cases.record()
    print(f"{cases.tried} notice socket cases in {elapsed:.1f} s")
