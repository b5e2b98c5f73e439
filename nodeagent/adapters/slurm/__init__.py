"""The agent on a Slurm node: the platform calls through ``scontrol`` instead of the Kubernetes
API (imported only with ``--platform slurm``; docs/slurm.md).

The agent's core is the same on both platforms. What it calls a pod is, on a Slurm node, one job
with a step here (``slurm/<job id>``); the node's taint is a drain with a reason of ours; an
eviction hands the job back to Slurm (shrunk off this node, or requeued, ``--slurm-on-notice``).
A worker names its job step (``SLURM_JOB_ID``, ``SLURM_STEP_ID``, ``SLURMD_NODENAME``) and the
agent asks Slurm whether the calling process belongs to it (:mod:`.callers`).

- :mod:`.runner`: the one place a command runs (injectable: tests check the exact argv);
- :mod:`.scontrol`: what scontrol prints, parsed, and the reasons the agent writes (pure);
- :mod:`.state`: the agent's own record on the node (live notices, jobs told), for a restart;
- :mod:`.cluster`: :class:`SlurmCluster`, the :class:`nodeagent.core.ports.ClusterPort`;
- :mod:`.callers`: :class:`SlurmCallers`, who may call the notice socket as a job step.
"""

from nodeagent.adapters.slurm.callers import SlurmCallers
from nodeagent.adapters.slurm.cluster import OnNotice, SlurmCluster
from nodeagent.adapters.slurm.runner import Result, Runner, SlurmError, run_command
from nodeagent.adapters.slurm.scontrol import job_key, job_uid

__all__ = [
    "OnNotice",
    "Result",
    "Runner",
    "SlurmCallers",
    "SlurmCluster",
    "SlurmError",
    "job_key",
    "job_uid",
    "run_command",
]
