"""``List`` over the kubelet's unix socket, reduced to GPU device id -> ``namespace/pod``."""

from __future__ import annotations

from collections.abc import Collection

import grpc

from nodeagent.adapters.podresources import api_pb2 as pb
from nodeagent.adapters.podresources import rpc

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
GPU_RESOURCES = frozenset({"nvidia.com/gpu"})


class PodResourcesError(Exception):
    """The kubelet's PodResources socket did not answer."""


async def gpu_owners(
    socket_path: str = DEFAULT_SOCKET,
    *,
    resources: Collection[str] = GPU_RESOURCES,
    time_limit: float = 5.0,
) -> dict[str, str]:
    """Device id (for NVIDIA's device plugin: the GPU UUID) -> the pod holding it."""
    try:
        async with grpc.aio.insecure_channel(f"unix:{socket_path}") as channel:
            stub = rpc.PodResourcesListerStub(channel)
            answer = await stub.List(pb.ListPodResourcesRequest(), timeout=time_limit)
    except grpc.aio.AioRpcError as exc:
        raise PodResourcesError(f"PodResources List at {socket_path}: {exc.details()}") from exc
    owners: dict[str, str] = {}
    for pod in answer.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if devices.resource_name in resources:
                    for device_id in devices.device_ids:
                        owners[str(device_id)] = f"{pod.namespace}/{pod.name}"
    return owners
