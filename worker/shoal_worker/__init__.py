"""The worker library: hear "checkpoint and leave by T" and acknowledge it.

    from shoal_worker import NoticeClient, PodIdentity

    client = NoticeClient.from_env()          # POD_NAMESPACE, POD_NAME, POD_UID, SHOAL_SOCKET
    async for notice in client.watch():       # the current state first, then every change
        if notice.leave:
            step = checkpoint()
            await client.acknowledge(step)

The identity comes from the Downward API (``metadata.namespace``, ``metadata.name``,
``metadata.uid``), or on a Slurm node from the job step's environment (``SLURM_JOB_ID``,
``SLURM_STEP_ID``, ``SLURMD_NODENAME``: :class:`SlurmStep`, picked when no pod identity is set);
the socket from the agent's hostPath (default ``/run/shoal/agent.sock``).
``python -m shoal_worker wait|ack`` does the same from a shell. For torch.distributed jobs,
:mod:`shoal_worker.distributed` (``pip install 'shoal-worker[torch]'``) stops every rank at one
step.

``ProgressReporter(client).report(step, checkpoint_step=..., ...)`` tells the agent how far the
worker is and its last complete checkpoint (paced, from a background thread), so that the
scheduler reclaims the members that would lose the least; the torch helper reports on its own.
"""

from shoal_worker.progress import ProgressReporter, Report
from shoal_worker.watcher import (
    AgentBusy,
    LeaveNotice,
    NoticeClient,
    NoticeRefused,
    PodIdentity,
    SlurmStep,
)

__all__ = [
    "AgentBusy",
    "LeaveNotice",
    "NoticeClient",
    "NoticeRefused",
    "PodIdentity",
    "ProgressReporter",
    "Report",
    "SlurmStep",
]
