"""A stand-in for the kubelet's PodResources server (v1 ``List``) on a unix socket."""

from __future__ import annotations

from typing import Any

import grpc

from nodeagent.adapters.podresources import api_pb2 as pb
from nodeagent.adapters.podresources import rpc


class FakePodResources(rpc.PodResourcesListerServicer):  # type: ignore[misc]
    """``pods`` maps ``namespace/name`` to the ``nvidia.com/gpu`` device ids it holds."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.pods: dict[str, list[str]] = {}
        self._server: Any = None

    async def List(self, request: Any, context: Any) -> pb.ListPodResourcesResponse:
        answer = pb.ListPodResourcesResponse()
        for key, devices in sorted(self.pods.items()):
            namespace, name = key.split("/", 1)
            pod = answer.pod_resources.add(name=name, namespace=namespace)
            container = pod.containers.add(name="worker")
            container.devices.add(resource_name="nvidia.com/gpu", device_ids=devices)
        return answer

    async def start(self) -> None:
        self._server = grpc.aio.server()
        rpc.add_servicer(self, self._server)
        self._server.add_insecure_port(f"unix:{self.socket_path}")
        await self._server.start()

    async def close(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
