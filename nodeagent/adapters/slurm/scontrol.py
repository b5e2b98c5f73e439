"""What ``scontrol`` prints, parsed, and what the agent writes into Slurm (pure: text in, values
out; the commands run in :mod:`nodeagent.adapters.slurm.cluster`).

- ``scontrol listpids``: ``PID JOBID STEPID LOCALID GLOBALID`` per process of a job step on
  this node, after a header line (:func:`steps`, :func:`pids`);
- ``scontrol -o show node|job``: one line of ``Key=Value`` fields; a node's ``Reason`` runs to
  the end of the line and ends with ``[user@time]`` (:func:`fields`, :func:`node_reason`);
- the reasons the agent gives Slurm: a drain says which notice and until when
  (:func:`drain_reason`), and every reason of ours starts with :data:`OURS`, so that the agent
  only ever resumes a node it drained itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from nodeagent.core.events import Notice, PodKey, PodUid, rfc3339

#: Every drain reason and job comment the agent writes starts with this.
OURS: Final = "shoal:"
#: How a job is known to the agent's core: the key and uid of its "pod" on this node.
KEY_PREFIX: Final = "slurm/"
UID_PREFIX: Final = "slurm:"

_JOB_ID = re.compile(r"^[0-9]+$")
_STEP_ID = re.compile(r"^([0-9]+|batch|extern|interactive)$")


def job_key(job: str) -> PodKey:
    return PodKey(f"{KEY_PREFIX}{job}")


def job_uid(job: str) -> PodUid:
    return PodUid(f"{UID_PREFIX}{job}")


def job_of(key: str) -> str:
    """The job id of a key made by :func:`job_key`."""
    return key.removeprefix(KEY_PREFIX)


def valid_job(job: str) -> bool:
    """A Slurm job id (``SLURM_JOB_ID``: digits)."""
    return bool(_JOB_ID.fullmatch(job)) and len(job) <= 20


def valid_step(step: str) -> bool:
    """A step id (``SLURM_STEP_ID``: digits, or one of Slurm's named steps)."""
    return bool(_STEP_ID.fullmatch(step)) and len(step) <= 20


@dataclass(frozen=True, slots=True)
class Process:
    """One line of ``scontrol listpids``."""

    pid: int
    job: str
    step: str


def processes(text: str) -> list[Process]:
    """The lines of ``scontrol listpids`` (header and anything unparseable skipped)."""
    found: list[Process] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3 or not parts[0].isdecimal() or not valid_job(parts[1]):
            continue
        found.append(Process(pid=int(parts[0]), job=parts[1], step=parts[2]))
    return found


def steps(text: str) -> dict[str, frozenset[str]]:
    """Each job with a step on this node, and its steps."""
    jobs: dict[str, set[str]] = {}
    for p in processes(text):
        jobs.setdefault(p.job, set()).add(p.step)
    return {job: frozenset(s) for job, s in jobs.items()}


def pids(text: str, job: str, step: str) -> frozenset[int]:
    """The processes of ``job``.``step`` in ``scontrol listpids`` output."""
    return frozenset(p.pid for p in processes(text) if p.job == job and p.step == step)


#: What ``scontrol listpids`` says when nothing runs here (exit status 1 on some versions).
NO_STEPS: Final = ("no job steps exist", "no job steps running")


def fields(line: str) -> dict[str, str]:
    """The ``Key=Value`` fields of a one-line ``scontrol -o show``, values without spaces (a
    value with spaces keeps its first word; see :func:`node_reason` for the reason)."""
    return dict(re.findall(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:]*)=(\S*)", line))


def node_reason(line: str) -> str:
    """A node's ``Reason`` in ``scontrol -o show node`` (empty when none), without the
    ``[user@time]`` Slurm appends."""
    at = line.find(" Reason=")
    if at < 0:
        return ""
    reason = line[at + len(" Reason=") :].strip()
    reason = re.sub(r"\s*\[[^\]]*@[^\]]*\]$", "", reason)
    return "" if reason in ("(null)", "None") else reason


def node_state(line: str) -> set[str]:
    """A node's state flags (``IDLE+DRAIN`` gives ``{"IDLE", "DRAIN"}``)."""
    return set(fields(line).get("State", "").upper().split("+")) - {""}


def draining(line: str) -> bool:
    """The node is drained or draining (Slurm shows either as a DRAIN flag)."""
    return bool(node_state(line) & {"DRAIN", "DRAINING", "DRAINED"})


_NODE_GRES = re.compile(r"(?:^|\s)Nodes=(\S+) CPU_IDs=\S* Mem=\S* GRES=(\S*)")
_GPU_IDX = re.compile(r"gpu[^,(]*\(IDX:([0-9,\-]+)\)")


def indices(text: str) -> set[int]:
    """``0-1,3`` as ``{0, 1, 3}``."""
    found: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        if low.isdecimal() and (not high or high.isdecimal()):
            found.update(range(int(low), int(high or low) + 1))
    return found


def job_gpus(line: str) -> list[tuple[str, set[int]]]:
    """The GPUs a job holds, per node expression, from ``scontrol -d -o show job``
    (``Nodes=sn1 CPU_IDs=0-1 Mem=0 GRES=gpu:2(IDX:0-1)``)."""
    held: list[tuple[str, set[int]]] = []
    for nodes, gres in _NODE_GRES.findall(line):
        gpus = set().union(*(indices(m) for m in _GPU_IDX.findall(gres)))
        if gpus:
            held.append((nodes, gpus))
    return held


def drain_reason(notice: Notice) -> str:
    """The drain reason for the most urgent notice: who, what, until when."""
    return f"{OURS} {notice.source} {notice.kind.value} until {rfc3339(notice.deadline)}"


def handback_comment(node: str, notice: Notice, how: str) -> str:
    """The job's AdminComment when the agent hands it back (``how``: requeued, shrunk)."""
    return (
        f"{OURS} {how} off {node}: {notice.source} {notice.kind.value} "
        f"until {rfc3339(notice.deadline)}"
    )


def ours(reason: str) -> bool:
    return reason.startswith(OURS)
