"""NVML to placement, end to end: node agents read the GPUs through the real pynvml (a fake
NVML library underneath) and the kubelet's PodResources socket (a stand-in on the real gRPC
protocol), publish each node's topology and GPU allocation, and the scheduler reads the
annotation to place a 4-GPU pod inside one NVLink island."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contracts import gputopology, names
from fakes import metadata
from fakes import nvml as fake_nvml
from fakes.clouds import NoCloud
from fakes.podresources import FakePodResources
from tests.integration.conftest import Devcluster
from tests.integration.nodeagent.harness import KWOK_TOLERATION, AgentProcess
from tests.integration.scheduler.conftest import Pods, Pool, SchedulerProcess
from tests.waiting import eventually

#: The fake NVML library's GPU UUIDs end in the GPU index.
FAKE_UUID = "GPU-fa4e0000-0000-4000-8000-00000000000"


def holder(name: str, node: str, gpus: int) -> dict[str, Any]:
    """A pod already running on ``node`` (bound by another scheduler) holding ``gpus`` GPUs."""
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "tolerations": [KWOK_TOLERATION],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/trainer:1",
                    "resources": {"limits": {names.GPU_RESOURCE: str(gpus)}},
                }
            ],
        },
    }


@pytest.fixture
def agents(
    devcluster: Devcluster, namespace: str, pool: Pool, tmp_path: Path
) -> Iterator[dict[str, list[int]]]:
    """Two 8-GPU nodes with two NVLink islands of four (GPUs 0-3 and 4-7) and no topology
    annotation of their own. Node "a" has GPUs 0, 1, 4 and 5 taken: 4 free, two in each
    island. Node "b" has GPUs 0, 1 and 2 taken: 5 free, one whole island among them. By count
    alone "a" is the tighter fit for a 4-GPU pod."""
    try:
        libdir = fake_nvml.build(tmp_path / "nvml")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    taken = {"a": [0, 1, 4, 5], "b": [0, 1, 2]}
    made = {key: pool.add(1, prefix=key, topology=False)[0] for key in taken}
    core = devcluster.core()
    servers = metadata.Threaded()
    cloud = NoCloud(servers)
    started: list[tuple[AgentProcess, FakePodResources]] = []
    try:
        for key, gpus in taken.items():
            node = made[key]
            core.create_namespaced_pod(namespace, holder(f"holder-{key}", node, len(gpus)))
            workdir = tmp_path / key
            workdir.mkdir()
            kubelet = FakePodResources(str(workdir / "kubelet.sock"))
            kubelet.pods[f"{namespace}/holder-{key}"] = [f"{FAKE_UUID}{i}" for i in gpus]
            servers.run(kubelet.start())
            agent = AgentProcess(
                kubeconfig=devcluster.kubeconfig,
                node=node,
                provider="none",
                metadata_url=cloud.url,
                workdir=workdir,
                extra=["--pod-resources-socket", kubelet.socket_path],
                env={"LD_LIBRARY_PATH": str(libdir), "FAKE_NVML_LAYOUT": "islands2x4"},
            )
            started.append((agent, kubelet))
            agent.start()
        yield {made[key]: gpus for key, gpus in taken.items()}
    finally:
        for agent, kubelet in started:
            agent.stop()
            servers.run(kubelet.close())
        servers.close()


def published(devcluster: Devcluster, node: str) -> gputopology.GpuTopology | None:
    annotations = devcluster.core().read_node(node).metadata.annotations or {}
    text = annotations.get(names.GPU_TOPOLOGY_ANNOTATION)
    if text is None:
        return None
    topology = gputopology.decode(text)
    return topology if topology.allocated else None


def test_the_agents_topology_puts_a_4_gpu_pod_inside_one_nvlink_island(
    devcluster: Devcluster,
    agents: dict[str, list[int]],
    pods: Pods,
    start_scheduler: Any,
) -> None:
    for node, gpus in agents.items():
        topology = eventually(
            lambda node=node: published(devcluster, node),  # type: ignore[misc]
            what=f"the agent's NVML topology and allocation on {node}",
        )
        islands = sorted(sorted(m) for m in topology.islands().values())
        assert islands == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert sorted(topology.allocated) == gpus
    node_a, node_b = agents
    proc: SchedulerProcess = start_scheduler()
    name = pods.create(f"trainer-{uuid.uuid4().hex[:4]}", gpus=4)
    placed = eventually(lambda: pods.node_of(name), what="the 4-GPU pod bound")
    assert placed == node_b, (
        f"placed on {placed}: its free GPUs straddle two islands ({node_a} keeps 2 + 2, "
        f"{node_b} keeps a whole island of 4)"
    )
    assert proc.stop() == 0
