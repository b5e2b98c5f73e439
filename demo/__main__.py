import os

# The demo starts component processes while its own gRPC clients are open; gRPC's fork handlers
# would only print warnings about that.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from demo.main import main

raise SystemExit(main())
