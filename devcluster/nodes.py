"""Fake GPU nodes that kwok runs: labels, allocatable, taint and a synthetic GPU topology.

``node_manifest`` is pure (a function of the spec and the node's position) so tests can check the
layout without a cluster; ``create`` sends the manifests to the API server.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from contracts import gputopology, names


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A homogeneous group of fake nodes spread over zones and racks."""

    count: int
    gpus: int = 8
    prefix: str = "gpu"
    product: str = "NVIDIA-H100-80GB-HBM3"
    cpu: str = "96"
    memory: str = "1Ti"
    pods: int = 110
    zones: int = 1
    racks_per_zone: int = 2
    spot_fraction: float = 0.0
    island_size: int = 4
    numa_nodes: int = 2
    topology: bool = True
    kwok_taint: bool = True
    region: str = "dev-region-1"
    extra_labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.count < 0 or self.gpus < 0 or self.zones < 1 or self.racks_per_zone < 1:
            raise ValueError("count and gpus must be >= 0; zones and racks-per-zone >= 1")
        if not 0.0 <= self.spot_fraction <= 1.0:
            raise ValueError(f"spot fraction must be within [0, 1], got {self.spot_fraction}")
        if self.island_size < 1:
            raise ValueError("island size must be >= 1")


def layout(spec: NodeSpec, index: int) -> tuple[int, int, bool]:
    """(zone, rack, spot) of node ``index``: contiguous racks; spot mixed into every rack."""
    racks = spec.zones * spec.racks_per_zone
    rack = index * racks // max(spec.count, 1)
    first = math.ceil(rack * spec.count / racks)
    size = math.ceil((rack + 1) * spec.count / racks) - first
    spot_here = round(size * spec.spot_fraction)
    return rack // spec.racks_per_zone, rack, (index - first) >= size - spot_here


def node_name(spec: NodeSpec, index: int) -> str:
    return f"{spec.prefix}-{index:04d}"


def node_manifest(spec: NodeSpec, index: int) -> dict[str, Any]:
    zone, rack, spot = layout(spec, index)
    name = node_name(spec, index)
    capacity_type = "spot" if spot else "on-demand"
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        names.REGION_LABEL: spec.region,
        names.ZONE_LABEL: f"{spec.region}-{chr(ord('a') + zone)}",
        names.RACK_LABEL: f"rack-{rack}",
        names.CAPACITY_TYPE_LABEL: capacity_type,
        "karpenter.sh/capacity-type": capacity_type,
        **spec.extra_labels,
    }
    annotations = {
        names.KWOK_NODE_ANNOTATION: names.KWOK_NODE_VALUE,
        "node.alpha.kubernetes.io/ttl": "0",
    }
    if spec.gpus:
        labels[names.GPU_PRODUCT_LABEL] = spec.product
        labels[names.GPU_COUNT_LABEL] = str(spec.gpus)
        labels["nvidia.com/gpu.present"] = "true"  # as NVIDIA GPU feature discovery labels
        if spec.topology:
            annotations[names.GPU_TOPOLOGY_ANNOTATION] = gputopology.encode(
                gputopology.uniform(
                    spec.gpus,
                    spec.island_size,
                    numa_nodes=spec.numa_nodes,
                    node_name=name,
                    product=spec.product,
                )
            )
    resources = {"cpu": spec.cpu, "memory": spec.memory, "pods": str(spec.pods)}
    if spec.gpus:
        resources[names.GPU_RESOURCE] = str(spec.gpus)
    taints = (
        [{"key": names.KWOK_TAINT, "value": names.KWOK_NODE_VALUE, "effect": "NoSchedule"}]
        if spec.kwok_taint
        else []
    )
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"taints": taints},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "fake",
                "kubeProxyVersion": "fake",
                "containerRuntimeVersion": "kwok",
                "kernelVersion": "kwok",
                "osImage": "kwok",
                "machineID": name,
                "systemUUID": name,
                "bootID": name,
            },
        },
    }


def manifests(spec: NodeSpec) -> Iterator[dict[str, Any]]:
    for i in range(spec.count):
        yield node_manifest(spec, i)


def create(kubeconfig: str, spec: NodeSpec, *, workers: int = 16) -> list[str]:
    """Create (or replace) the nodes; returns their names. Uses ``workers`` concurrent requests."""
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    api_client = config.new_client_from_config(config_file=kubeconfig)
    api_client.configuration.connection_pool_maxsize = max(workers, 4)
    core = client.CoreV1Api(api_client)

    def one(body: dict[str, Any]) -> str:
        name = str(body["metadata"]["name"])
        try:
            core.create_node(body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            core.delete_node(name)
            core.create_node(body)
        return name

    with ThreadPoolExecutor(max_workers=workers) as pool:
        created = list(pool.map(one, manifests(spec)))
    api_client.close()
    return created
