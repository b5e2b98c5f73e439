"""The ``shoal.v1.Notices`` protocol: the one contract between the node agent and its workers.

``notices.proto`` is the contract; ``notices_pb2*.py`` (and ``.pyi``) are generated from it and
committed; ``rpc.py`` holds typed handles on the generated service glue. The agent serves it
(``nodeagent/notify/server.py``) and imports it from here, so both sides always speak the
version this distribution carries. Regenerate from ``worker/`` with::

    ../.venv/bin/python -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. \\
        --pyi_out=. shoal_worker/protocol/notices.proto
"""
