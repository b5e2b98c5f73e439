"""Who may use the notice socket as a Slurm job step: checked with Slurm, never taken from the
caller.

A worker names its job step (``SLURM_JOB_ID``, ``SLURM_STEP_ID``, ``SLURMD_NODENAME``); the
notice socket knows the calling process from the kernel (``SO_PEERCRED``, see
:mod:`nodeagent.notify.peers`). The caller is admitted only when the step's node is this node
and this node's slurmd lists the calling process in that step (``scontrol listpids <job>
<node>``, which lists each process with its step). The job is then known to the agent's core as
its "pod" (``slurm/<job id>``), which the board checks against the jobs on the node as for any
pod.
"""

from __future__ import annotations

import asyncio

import structlog

from nodeagent.adapters.slurm import scontrol
from nodeagent.adapters.slurm.runner import Runner, run_command
from nodeagent.core.events import PodKey, PodUid

log = structlog.get_logger("nodeagent.adapters.slurm")

#: scontrol commands at once for callers (a burst of workers cannot fork a storm).
CONCURRENCY = 4


class SlurmCallers:
    """Satisfies :class:`nodeagent.notify.peers.StepCallers` on node ``node_name``."""

    def __init__(
        self, node_name: str, *, runner: Runner = run_command, command: str = "scontrol"
    ) -> None:
        self.node_name = node_name
        self._runner = runner
        self._command = command
        self._slots = asyncio.Semaphore(CONCURRENCY)

    async def admit(self, job: str, step: str, node: str, pid: int) -> tuple[PodKey, PodUid] | str:
        """The job's key and uid when process ``pid`` runs in ``job``.``step`` on this node;
        else why not (what the caller is told)."""
        if not scontrol.valid_job(job) or not scontrol.valid_step(step):
            return (
                "name the job step: SLURM_JOB_ID (digits) and SLURM_STEP_ID (digits, batch, "
                "extern or interactive)"
            )
        if node != self.node_name:
            here = self.node_name
            return f"job step {job}.{step} names node {node[:64]!r}; this agent serves {here}"
        # The whole job's processes here, filtered by step: scontrol takes only numeric step
        # ids (``42.batch`` does not parse), and prints every step's name.
        argv = (self._command, "listpids", job, self.node_name)
        async with self._slots:
            result = await asyncio.to_thread(self._runner, argv)
        if not result.ok or pid not in scontrol.pids(result.out, job, step):
            log.info(
                "slurm_caller_refused",
                job=job,
                step=step,
                pid=pid,
                node=self.node_name,
                slurm=(result.err or "").strip()[:200],
            )
            return f"process {pid} is not in job step {job}.{step} on {self.node_name}"
        return scontrol.job_key(job), scontrol.job_uid(job)
