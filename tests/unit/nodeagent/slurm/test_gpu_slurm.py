"""A failed GPU on a Slurm node: Slurm says which job holds it (the kubelet does on
Kubernetes), that job is told and handed back like any other, and the node is drained so that
Slurm places nothing more on the failed GPU."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta
from pathlib import Path

from contracts.gputopology import Gpu, GpuTopology
from nodeagent.adapters.slurm import SlurmCluster
from nodeagent.core.events import EventId, Kind, Notice, Pod, PodKey, PodUid
from nodeagent.wiring import cli
from tests.unit.nodeagent.slurm.fake_slurm import FakeSlurm, Job

NODE = "gpu-1"


def slurm() -> FakeSlurm:
    return FakeSlurm(
        node=NODE,
        jobs={
            "42": Job(steps={"0": [102]}, nodes=[NODE], gpus={NODE: [0, 1]}),
            "7": Job(steps={"0": [201]}, nodes=["gpu-0", NODE], gpus={"gpu-0": [2], NODE: [3]}),
        },
    )


def test_slurm_says_which_job_holds_each_gpu_of_this_node() -> None:
    fake = slurm()
    held = SlurmCluster(NODE, runner=fake).gpu_jobs()
    assert held == {0: "slurm/42", 1: "slurm/42", 3: "slurm/7"}
    assert ("scontrol", "-d", "-o", "show", "job", "42") in fake.calls


def test_a_gpu_fault_told_to_its_job_drains_the_node_unless_it_is_drained() -> None:
    fake = slurm()
    cluster = SlurmCluster(NODE, runner=fake)
    fault = Notice(
        event_id=EventId("gpu-fault-GPU-1"),
        source="gpu",
        channel="gpu",
        kind=Kind.GPU_FAULT,
        deadline=datetime(2026, 12, 2, 12, 30, tzinfo=UTC),
        reason="GPU 1 (GPU-1) failed: XID 79",
        scope=frozenset({PodKey("slurm/42")}),
    )
    job = Pod(key=PodKey("slurm/42"), uid=PodUid("slurm:42"))
    assert cluster.annotate_pod(job, fault)
    assert fake.reason == "shoal: gpu gpu-fault until 2026-12-02T12:30:00Z"
    assert cluster.evict(job, "acknowledged")
    assert fake.requeued == ["42"]
    # A node drained already (an administrator's reason here) keeps its drain and reason.
    fake.reason = "bad DIMM"
    assert cluster.annotate_pod(job, fault)
    assert fake.reason == "bad DIMM"


async def test_the_slurm_agent_gives_the_gpu_monitor_each_gpus_job_by_uuid(tmp_path: Path) -> None:
    fake = slurm()
    args = cli.parser().parse_args(
        ["--platform", "slurm", "--node-name", NODE, "--state-dir", str(tmp_path)]
    )
    assert isinstance(args, argparse.Namespace)
    agent = cli.build_slurm_agent(args, SlurmCluster(NODE, runner=fake), NoCloud())
    monitor = agent.gpu
    assert monitor is not None
    assert monitor.owners is not None
    assert await monitor.owners() == {}  # no topology read yet: nothing to name
    monitor.topology = GpuTopology(
        gpus=tuple(
            Gpu(index=i, uuid=f"GPU-{i}", numa=0, health="healthy", island=0) for i in range(4)
        ),
        links=(),
    )
    assert await monitor.owners() == {"GPU-0": "slurm/42", "GPU-1": "slurm/42", "GPU-3": "slurm/7"}
    await agent.stop()


class NoCloud:
    name = "none"

    async def watch(self, sink: object) -> None: ...

    def stale_after(self) -> float:
        return float(timedelta(minutes=1).total_seconds())

    async def acknowledge(self, notice: Notice) -> None: ...

    async def aclose(self) -> None: ...
