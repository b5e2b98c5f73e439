"""The worker library's former home, kept so that existing images and scripts go on working.

The worker library is its own distribution now, ``shoal-worker`` (``worker/``, package
:mod:`shoal_worker`; docs/workers.md): ``pip install shoal-worker`` brings grpcio and protobuf
only. ``from nodeagent.client import NoticeClient`` and ``python -m nodeagent.client wait|ack``
still work: they are the same objects and the same command, re-exported from there (no warning:
a training image built before the move keeps running unchanged). New code imports
:mod:`shoal_worker`.

``python -m nodeagent.client.discover`` (Horovod host discovery) stays here: it reads pods from
the API server with the agent's Kubernetes client (``nodeagent/adapters/k8s/discover.py``).
"""

from shoal_worker import AgentBusy, LeaveNotice, NoticeClient, NoticeRefused, PodIdentity

__all__ = ["AgentBusy", "LeaveNotice", "NoticeClient", "NoticeRefused", "PodIdentity"]
