"""The agent on a Slurm node, end to end without Slurm: the real agent, the real notice socket
(with the relay that reads each caller's process from the kernel), the Slurm adapter, and a
stand-in for scontrol at the runner seam. This test process is the worker: Slurm (the
stand-in) lists its pid in job 42's step 0 on this node.

What a Slurm user would notice: a notice drains the node with the agent's reason, the job
step's worker hears it, its acknowledgement has the job requeued, a withdrawn notice resumes
the node; a process that is not in the step it names hears nothing and cannot acknowledge."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from shoal_worker import NoticeClient, SlurmStep
from shoal_worker.protocol import notices_pb2 as pb
from shoal_worker.protocol import rpc

from nodeagent.adapters.slurm import SlurmCallers, SlurmCluster
from nodeagent.notify.peers import PeerRelay, StepGate
from nodeagent.notify.server import serve
from nodeagent.wiring.agent import Agent
from tests.unit.nodeagent.notice_socket import SocketAgent, notice
from tests.unit.nodeagent.slurm.fake_slurm import FakeSlurm, Job

NODE = "gpu-1"


class SlurmNode(SocketAgent):
    """A :class:`SocketAgent` on a Slurm node: ``slurm`` is what scontrol answers."""

    def __init__(self, socket_path: Path, slurm: FakeSlurm) -> None:
        super().__init__(socket_path)
        self.slurm = slurm
        self.slurm_cluster = SlurmCluster(NODE, runner=slurm)

    def start(self) -> None:
        async def start() -> Agent:
            agent = Agent(self.slurm_cluster, [], node_name=NODE)
            relay = PeerRelay()
            agent.service.steps = StepGate(SlurmCallers(NODE, runner=self.slurm), relay)
            self._server = await serve(agent.service, self.socket_path, relay=relay)
            agent.start()
            return agent

        self.agent = self.call(start)
        self.channel = grpc.insecure_channel(f"unix:{self.socket_path}")
        self.stub = rpc.NoticesStub(self.channel)
        self.until(lambda: self.a.pods.restored, "the agent restored its state")


def step(job: str = "42", step_id: str = "0", node: str = NODE) -> pb.PodIdentity:
    return pb.PodIdentity(slurm=pb.SlurmStep(job_id=job, step_id=step_id, node=node))


@pytest.fixture
def slurm() -> FakeSlurm:
    return FakeSlurm(
        node=NODE,
        jobs={"42": Job(steps={"batch": [os.getppid()], "0": [os.getpid()]}, nodes=[NODE])},
    )


@pytest.fixture
def node(tmp_path: Path, slurm: FakeSlurm) -> Iterator[SlurmNode]:
    agent = SlurmNode(tmp_path / "agent.sock", slurm)
    agent.start()
    yield agent
    agent.stop()


def test_a_notice_drains_the_node_tells_the_step_and_its_ack_requeues_the_job(
    node: SlurmNode, slurm: FakeSlurm
) -> None:
    watch = node.stub.Watch(pb.WatchRequest(pod=step()), timeout=10)
    assert next(watch).state == pb.Notice.NONE
    spot = notice()
    node.observe([spot])
    told = next(watch)
    assert (told.state, told.event_id, told.source) == (pb.Notice.LEAVE, "spot-1", "aws")
    node.until(lambda: slurm.reason.startswith("shoal: aws terminate until"), "the node drained")
    assert "DRAIN" in slurm.state
    assert slurm.requeued == []  # not before the worker answers (the deadline is an hour away)
    reply = node.stub.Acknowledge(pb.AcknowledgeRequest(pod=step(), step=1234), timeout=10)
    assert (reply.accepted, reply.detail) == (True, "accepted")
    node.until(lambda: slurm.requeued == ["42"], "the acknowledged job was requeued")
    assert slurm.comments["42"].startswith(f"shoal: requeued off {NODE}: aws terminate until")
    watch.cancel()
    # The notice withdrawn: the node takes jobs again.
    node.observe([])
    node.until(lambda: slurm.state == "IDLE" and not slurm.reason, "the node resumed")
    assert ("scontrol", "update", f"nodename={NODE}", "state=resume") in slurm.writes()


@pytest.mark.reliability
def test_a_process_outside_the_step_it_names_hears_nothing_and_cannot_ack(
    node: SlurmNode, slurm: FakeSlurm
) -> None:
    node.observe([notice()])
    node.settle()
    # This process is in step 0, not in the batch step, nor in job 9 (on this node too).
    slurm.jobs["9"] = Job(steps={"0": [1]}, nodes=[NODE])
    for who in (step(step_id="batch"), step(job="9"), step(node="gpu-0")):
        with pytest.raises(grpc.RpcError) as refused:
            next(node.stub.Watch(pb.WatchRequest(pod=who), timeout=10))
        assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED, who
        with pytest.raises(grpc.RpcError) as refused:
            node.stub.Acknowledge(pb.AcknowledgeRequest(pod=who, step=1), timeout=10)
        assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED, who
    node.settle()
    assert slurm.requeued == []


@pytest.mark.reliability
def test_a_slurm_agent_takes_no_pod_identity_not_even_one_naming_a_job(node: SlurmNode) -> None:
    node.observe([notice()])
    node.settle()
    forged = pb.PodIdentity(namespace="slurm", name="42", uid="slurm:42")
    with pytest.raises(grpc.RpcError) as refused:
        node.stub.Acknowledge(pb.AcknowledgeRequest(pod=forged, step=1), timeout=10)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "Slurm job steps" in str(refused.value.details())


def test_a_kubernetes_agent_refuses_a_caller_naming_a_job_step(tmp_path: Path) -> None:
    agent = SocketAgent(tmp_path / "agent.sock")
    agent.start()
    try:
        with pytest.raises(grpc.RpcError) as refused:
            next(agent.stub.Watch(pb.WatchRequest(pod=step()), timeout=10))
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    finally:
        agent.stop()


def test_the_worker_library_names_its_job_step_from_the_slurm_environment(
    node: SlurmNode, slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("POD_NAMESPACE", "POD_NAME", "POD_UID", "SLURM_STEPID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    monkeypatch.setenv("SLURMD_NODENAME", NODE)
    monkeypatch.setenv("SHOAL_SOCKET", node.socket_path)
    client = NoticeClient.from_env()
    assert client.pod == SlurmStep("42", "0", NODE)
    node.observe([notice()])
    node.settle()
    assert asyncio.run(client.acknowledge(77)) == "accepted"
    node.until(lambda: slurm.requeued == ["42"], "the acknowledged job was requeued")
