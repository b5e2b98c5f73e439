"""Typed handles on the generated (unannotated) gRPC glue; hand-written code imports these."""

from typing import Any

from nodeagent.adapters.podresources import api_pb2_grpc as _generated

PodResourcesListerStub: Any = _generated.PodResourcesListerStub
PodResourcesListerServicer: Any = _generated.PodResourcesListerServicer
add_servicer: Any = _generated.add_PodResourcesListerServicer_to_server
