"""Serving the ``shoal.v1.Notices`` gRPC service: how workers hear their notice and acknowledge it.

``server.py`` serves it on the unix socket and keeps the socket at its path (``socketfile.py``:
the socket and its folder as files). The protocol itself (``notices.proto`` and the code
generated from it) lives in the worker distribution, ``shoal_worker.protocol``
(``worker/shoal_worker/protocol/``), which the agent depends on.
"""
