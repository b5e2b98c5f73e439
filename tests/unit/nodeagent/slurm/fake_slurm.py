"""A stand-in for ``scontrol`` on one node, at the adapter's runner seam: it answers the
commands the Slurm adapter runs as scontrol prints them, keeps what they changed (the node's
state and reason, the jobs here, requeues, comments), and records every argv, so that a test
checks the exact commands without Slurm."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from nodeagent.adapters.slurm import Result

HEADER = "PID      JOBID    STEPID   LOCALID GLOBALID"
NO_STEPS = "No job steps exist on this node.\n"


@dataclass
class Job:
    steps: dict[str, list[int]]
    nodes: list[str]
    requeue: bool = True
    #: The GPU indices the job holds on each node.
    gpus: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class FakeSlurm:
    node: str = "gpu-1"
    state: str = "IDLE"
    reason: str = ""
    jobs: dict[str, Job] = field(default_factory=dict)
    calls: list[tuple[str, ...]] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    comments: dict[str, str] = field(default_factory=dict)
    #: argv (after "scontrol") -> the answer to give instead.
    answers: dict[tuple[str, ...], Result] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, argv: Sequence[str]) -> Result:
        args = tuple(argv)
        with self.lock:
            self.calls.append(args)
            assert args[0] == "scontrol", args
            if args[1:] in self.answers:
                return self.answers[args[1:]]
            return self._answer(args, list(args[1:]))

    def writes(self) -> list[tuple[str, ...]]:
        """The commands that change Slurm, in order."""
        return [c for c in self.calls if c[1] in ("update", "requeue")]

    def here(self) -> dict[str, Job]:
        return {j: job for j, job in self.jobs.items() if self.node in job.nodes}

    def _answer(self, argv: tuple[str, ...], a: list[str]) -> Result:
        handlers: dict[str, Callable[[list[str]], str | tuple[str] | None]] = {
            "listpids": self._listpids,
            "-o": self._show,
            "-d": self._detail,
            "update": self._update,
            "requeue": self._requeue,
            "show": self._hostnames,
        }
        handler = handlers.get(a[0])
        out = None if handler is None else handler(a)
        if out is None:
            return Result(argv, 1, "", f"fake scontrol: unexpected {' '.join(argv)}\n")
        if isinstance(out, tuple):
            return Result(argv, 1, "", out[0])
        return Result(argv, 0, out, "")

    def _listpids(self, a: list[str]) -> str | tuple[str] | None:
        """``listpids * NODE`` or ``listpids JOB NODE`` (scontrol takes no named step)."""
        if len(a) != 3 or a[2] != self.node:
            return None
        if a[1] == "*":
            lines = [
                f"{pid} {job} {step} 0 0"
                for job, j in self.here().items()
                for step, pids in j.steps.items()
                for pid in pids
            ]
            return "\n".join([HEADER, *lines]) + "\n" if lines else (NO_STEPS,)
        job = a[1]
        j = self.here().get(job)
        if not job.isdecimal():
            return (f'"{job}" does not look like a jobid\n',)
        if j is None:
            return (f"There are no steps for job {job} on node {self.node}.\n",)
        rows = [f"{p} {job} {step} 0 0" for step, pids in j.steps.items() for p in pids]
        return "\n".join([HEADER, *rows]) + "\n"

    def _show(self, a: list[str]) -> str | None:
        """``-o show node NODE`` or ``-o show job JOB``."""
        match a:
            case ["-o", "show", "node", node] if node == self.node:
                reason = f" Reason={self.reason} [root@2026-12-02T12:00:00]" if self.reason else ""
                return f"NodeName={node} Arch=x86_64 CPUTot=8 State={self.state}{reason}\n"
            case ["-o", "show", "job", job] if job in self.jobs:
                j = self.jobs[job]
                return (
                    f"JobId={job} JobName=train JobState=RUNNING Reason=None "
                    f"NodeList={','.join(j.nodes)} NumNodes={len(j.nodes)}\n"
                )
        return None

    def _detail(self, a: list[str]) -> str | None:
        """``-d -o show job JOB``: with each node's GRES and GPU indices."""
        if a[:4] != ["-d", "-o", "show", "job"] or a[4] not in self.jobs:
            return None
        j = self.jobs[a[4]]
        per_node = " ".join(
            f"Nodes={node} CPU_IDs=0-1 Mem=0 GRES=gpu:{len(idx)}(IDX:{','.join(map(str, idx))})"
            for node, idx in j.gpus.items()
        )
        return f"JobId={a[4]} JobState=RUNNING NodeList={','.join(j.nodes)} {per_node} Foo=1\n"

    def _update(self, a: list[str]) -> str | None:
        """The node's state, a job's comment or node list."""
        what, _, value = a[-1].partition("=")
        if a[1] == f"nodename={self.node}":
            drained = a[2] == "state=drain"
            self.state, self.reason = ("IDLE+DRAIN", value) if drained else ("IDLE", "")
            return ""
        job = self.jobs.get(a[1].removeprefix("jobid="))
        if job is None or what not in ("admincomment", "nodelist"):
            return None
        if what == "admincomment":
            self.comments[a[1].removeprefix("jobid=")] = value
        else:
            job.nodes = value.split(",")
        return ""

    def _requeue(self, a: list[str]) -> str | tuple[str]:
        job = self.jobs.get(a[1])
        if job is None:
            return (f"Invalid job id specified for job {a[1]}\n",)
        if not job.nodes:
            return ("Job is pending execution\n",)
        if not job.requeue:
            return (f"Requested operation is disabled for job {a[1]}\n",)
        job.nodes = []  # pending again, on no node
        self.requeued.append(a[1])
        return ""

    def _hostnames(self, a: list[str]) -> str | None:
        """``show hostnames LIST`` (the fake's lists are comma-separated names)."""
        return "\n".join(a[2].split(",")) + "\n" if a[1] == "hostnames" else None
