"""The worker library: hear "checkpoint and leave by T" and acknowledge it.

    from shoal_worker import NoticeClient, PodIdentity

    client = NoticeClient.from_env()          # POD_NAMESPACE, POD_NAME, POD_UID, SHOAL_SOCKET
    async for notice in client.watch():       # the current state first, then every change
        if notice.leave:
            step = checkpoint()
            await client.acknowledge(step)

The identity comes from the Downward API (``metadata.namespace``, ``metadata.name``,
``metadata.uid``); the socket from the agent's hostPath (default ``/run/shoal/agent.sock``).
``python -m shoal_worker wait|ack`` does the same from a shell. For torch.distributed jobs,
:mod:`shoal_worker.distributed` (``pip install 'shoal-worker[torch]'``) stops every rank at one
step.
"""

from shoal_worker.watcher import (
    AgentBusy,
    LeaveNotice,
    NoticeClient,
    NoticeRefused,
    PodIdentity,
)

__all__ = ["AgentBusy", "LeaveNotice", "NoticeClient", "NoticeRefused", "PodIdentity"]
