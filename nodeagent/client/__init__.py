"""The worker library: hear "checkpoint and leave by T" and acknowledge it.

    from nodeagent.client import NoticeClient, PodIdentity

    client = NoticeClient.from_env()          # POD_NAMESPACE, POD_NAME, POD_UID, SHOAL_SOCKET
    async for notice in client.watch():       # the current state first, then every change
        if notice.leave:
            step = checkpoint()
            await client.acknowledge(step)

The identity comes from the Downward API (``metadata.namespace``, ``metadata.name``,
``metadata.uid``); the socket from the agent's hostPath (default ``/run/shoal/agent.sock``).
``python -m nodeagent.client wait|ack`` does the same from a shell. For torch.distributed jobs,
:mod:`nodeagent.client.distributed` (the ``torch`` extra) stops every rank at one step.
"""

from nodeagent.client.watcher import (
    AgentBusy,
    LeaveNotice,
    NoticeClient,
    NoticeRefused,
    PodIdentity,
)

__all__ = ["AgentBusy", "LeaveNotice", "NoticeClient", "NoticeRefused", "PodIdentity"]
