"""Client of the kubelet PodResources API (v1 ``List``): which GPU serves which pod.

``api.proto`` is a subset of the upstream definition; ``api_pb2*.py`` are generated from it and
committed. Regenerate from the repository root with::

    .venv/bin/python -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. \\
        --pyi_out=. nodeagent/adapters/podresources/api.proto
"""

from nodeagent.adapters.podresources.client import DEFAULT_SOCKET, PodResourcesError, gpu_owners

__all__ = ["DEFAULT_SOCKET", "PodResourcesError", "gpu_owners"]
