"""Typed handles on the generated (unannotated) gRPC glue; hand-written code imports these."""

from typing import Any

from shoal_worker.protocol import notices_pb2_grpc as _generated

NoticesStub: Any = _generated.NoticesStub
NoticesServicer: Any = _generated.NoticesServicer
add_servicer: Any = _generated.add_NoticesServicer_to_server
