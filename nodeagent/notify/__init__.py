"""The ``shoal.v1.Notices`` gRPC service: how workers hear their notice and acknowledge it.

``server.py`` serves it on the unix socket and keeps the socket at its path (``socketfile.py``:
the socket and its folder as files). ``notices.proto`` is the contract; ``notices_pb2*.py`` are
generated from it and committed. Regenerate from the repository root with::

    .venv/bin/python -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. \\
        --pyi_out=. nodeagent/notify/notices.proto
"""
