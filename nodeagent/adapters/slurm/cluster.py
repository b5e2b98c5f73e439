"""The agent's platform calls on a Slurm node (:class:`SlurmCluster`, a
:class:`nodeagent.core.ports.ClusterPort`), through ``scontrol``.

What each call of the core means here:

- ``list_pods``: the jobs with a step on this node (``scontrol listpids``, answered by this
  node's slurmd), each a :class:`~nodeagent.core.events.Pod` keyed ``slurm/<job id>``;
- ``sync_node``: drain the node, reason ``shoal: <source> <kind> until <deadline>`` (Slurm
  starts nothing new on it), or, once every notice is gone, resume it if the drain reason is
  still ours (a node an administrator drained stays drained);
- ``annotate_pod``/``clear_pod``: the notice a job was told, kept in the agent's record
  (:mod:`.state`; the workers hear it over the notice socket);
- ``evict`` (at the workers' acknowledgement, or at the margin): hand the job back to Slurm as
  ``--slurm-on-notice`` says: ``requeue`` (``scontrol requeue``; the default, what a Slurm
  administrator expects of a node going away), ``shrink`` (its node list without this node,
  when the job has other nodes and Slurm takes it, else requeued), or ``none`` (left to Slurm);
  the job's AdminComment says why;
- ``delete`` (the last resort at the deadline): nothing more is done to a job already handed
  back; a log line says it is still here;
- Events (``warn_pod``, ``warn_node``) are log lines: Slurm has no place for them.

Every action is a log line with the job, the node, the command and the reason. Commands run
through one :class:`~nodeagent.adapters.slurm.runner.Runner`; with ``dry_run`` the writes are
logged and not run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path

import structlog

from nodeagent.adapters.slurm import scontrol
from nodeagent.adapters.slurm.runner import Result, Runner, SlurmError, run_command
from nodeagent.adapters.slurm.state import FILENAME, Record, StateFile
from nodeagent.core.events import Kind, Notice, Pod, PodKey, Tracked, rfc3339

log = structlog.get_logger("nodeagent.adapters.slurm")


class OnNotice(StrEnum):
    """What the agent does with a job once its workers acknowledged or the margin came."""

    REQUEUE = "requeue"
    SHRINK = "shrink"
    NONE = "none"


#: What scontrol says of a job that is no longer there to hand back.
_GONE = ("invalid job id", "already completing or completed", "job is pending execution")


class SlurmCluster:
    """Satisfies :class:`nodeagent.core.ports.ClusterPort` on node ``node_name``; blocking
    (the agent calls it on its API threads)."""

    def __init__(
        self,
        node_name: str,
        *,
        on_notice: OnNotice = OnNotice.REQUEUE,
        runner: Runner = run_command,
        command: str = "scontrol",
        state_dir: Path | None = None,
        dry_run: bool = False,
    ) -> None:
        self.node_name = node_name
        self.on_notice = on_notice
        self.dry_run = dry_run
        #: When Slurm last answered (monotonic), for ``/readyz``.
        self.last_ok = 0.0
        self._runner = runner
        self._command = command
        self._state = StateFile(None if state_dir is None else state_dir / FILENAME)
        self._loaded = False
        #: The record is changed from several API threads.
        self._lock = threading.Lock()

    # --- commands --------------------------------------------------------------------------

    def _run(self, *args: str) -> Result:
        result = self._runner((self._command, *args))
        if result.ok:
            self.last_ok = time.monotonic()
        return result

    def _read(self, *args: str) -> str:
        result = self._run(*args)
        if not result.ok:
            raise result.error()
        return result.out

    def _write(self, *args: str) -> Result:
        """A command that changes Slurm; only logged on a dry run."""
        if self.dry_run:
            log.info("slurm_command_skipped", argv=[self._command, *args], dry_run=True)
            return Result((self._command, *args), 0)
        return self._run(*args)

    def _record(self) -> Record:
        if not self._loaded:
            self._state.load()
            self._loaded = True
        return self._state.record

    # --- reads -----------------------------------------------------------------------------

    def read_revocation(self) -> list[Tracked]:
        """The notices the agent drained this node under before it restarted."""
        with self._lock:
            return list(self._record().notices)

    def list_pods(self) -> list[Pod]:
        """The jobs with a step on this node."""
        result = self._run("listpids", "*", self.node_name)
        said = (result.out + result.err).lower()
        if not result.ok and any(m in said for m in scontrol.NO_STEPS):
            jobs: dict[str, frozenset[str]] = {}
            self.last_ok = time.monotonic()
        elif not result.ok:
            raise result.error()
        else:
            jobs = scontrol.steps(result.out)
        with self._lock:
            record = self._record()
            gone = [job for job in record.told if job not in jobs]
            for job in gone:
                del record.told[job]
            if gone:
                self._state.save()
            told = dict(record.told)
        return [
            Pod(
                key=scontrol.job_key(job),
                uid=scontrol.job_uid(job),
                worker=True,
                leave_by=told[job].deadline if job in told else None,
            )
            for job in sorted(jobs, key=lambda j: (len(j), j))
        ]

    # --- the node --------------------------------------------------------------------------

    def sync_node(self, tracked: Sequence[Tracked]) -> None:
        """Drain the node for the most urgent of ``tracked``, or resume it when ``tracked`` is
        empty and the drain is ours."""
        line = self._read("-o", "show", "node", self.node_name)
        reason, drained = scontrol.node_reason(line), scontrol.draining(line)
        if tracked:
            self._drain(tracked[0].notice, reason, drained=drained)
        elif drained and scontrol.ours(reason):
            result = self._write("update", f"nodename={self.node_name}", "state=resume")
            if not result.ok:
                raise result.error()
            log.info(
                "slurm_node_resumed",
                node=self.node_name,
                action="resume",
                previous_reason=reason,
                dry_run=self.dry_run,
            )
        elif drained:
            log.info("slurm_node_left_drained", node=self.node_name, reason=reason)
        with self._lock:
            self._record().notices = list(tracked)
            self._state.save()

    def _drain(self, notice: Notice, reason: str, *, drained: bool) -> None:
        want = scontrol.drain_reason(notice)
        if drained and reason == want:
            return
        if drained and reason and not scontrol.ours(reason):
            # An administrator's drain says more than ours would: it is left as it is.
            log.info(
                "slurm_node_drained_by_other",
                node=self.node_name,
                reason=reason,
                event_id=notice.event_id,
            )
            return
        result = self._write(
            "update", f"nodename={self.node_name}", "state=drain", f"reason={want}"
        )
        if not result.ok:
            raise result.error()
        log.warning(
            "slurm_node_drained",
            node=self.node_name,
            action="drain",
            reason=want,
            event_id=notice.event_id,
            source=notice.source,
            deadline=rfc3339(notice.deadline),
            dry_run=self.dry_run,
        )

    def gpu_jobs(self) -> dict[int, PodKey]:
        """Which job holds each GPU of this node (by the index Slurm gives it, NVML's with
        ``AutoDetect=nvml`` in gres.conf): the jobs here, each asked for its GPUs."""
        held: dict[int, PodKey] = {}
        for pod in self.list_pods():
            job = scontrol.job_of(pod.key)
            for nodes, gpus in scontrol.job_gpus(self._read("-d", "-o", "show", "job", job)):
                if self._on_this_node(nodes):
                    held.update(dict.fromkeys(gpus, pod.key))
        return held

    def _on_this_node(self, nodes: str) -> bool:
        if nodes == self.node_name:
            return True
        if "[" not in nodes and "," not in nodes:
            return False
        return self.node_name in self._read("show", "hostnames", nodes).split()

    def write_topology(self, text: str) -> None:
        """Slurm has no place for the GPU topology document (gres.conf describes the GPUs)."""

    def warn_node(self, reason: str, message: str) -> None:
        log.warning("slurm_node_warning", node=self.node_name, reason=reason, message=message)

    def close(self) -> None:
        """Nothing is held open between commands."""

    # --- the jobs --------------------------------------------------------------------------

    def annotate_pod(self, pod: Pod, notice: Notice) -> bool:
        """Keep the notice the job was told (its workers heard it over the socket). A failed
        GPU also drains the node (reason ``shoal: gpu gpu-fault until ...``), so that Slurm
        places nothing more on it; that drain stays until an administrator resumes the node
        (or a withdrawn node-wide notice does)."""
        job = scontrol.job_of(pod.key)
        if notice.kind is Kind.GPU_FAULT:
            line = self._read("-o", "show", "node", self.node_name)
            if not scontrol.draining(line):
                self._drain(notice, "", drained=False)
        with self._lock:
            self._record().told[job] = notice
            self._state.save()
        log.info(
            "slurm_job_told",
            job=job,
            node=self.node_name,
            event_id=notice.event_id,
            deadline=rfc3339(notice.deadline),
            reason=notice.reason,
        )
        return True

    def annotate_progress(self, pod: Pod, text: str) -> bool:
        """Progress reports serve the Kubernetes scheduler's reclaim; Slurm does not read them."""
        return True

    def clear_pod(self, pod: Pod) -> bool:
        job = scontrol.job_of(pod.key)
        with self._lock:
            if self._record().told.pop(job, None) is not None:
                self._state.save()
        log.info("slurm_job_notice_withdrawn", job=job, node=self.node_name)
        return True

    def warn_pod(self, pod: Pod, reason: str, message: str) -> None:
        log.warning(
            "slurm_job_warning",
            job=scontrol.job_of(pod.key),
            node=self.node_name,
            reason=reason,
            message=message,
        )

    def evict(self, pod: Pod, reason: str) -> bool:
        """Hand the job back to Slurm (``reason``: acknowledged, deadline or drain); False when
        Slurm refused (tried again later)."""
        job = scontrol.job_of(pod.key)
        with self._lock:
            notice = self._record().told.get(job)
        if self.on_notice is OnNotice.NONE:
            log.info("slurm_job_left_to_slurm", job=job, node=self.node_name, why=reason)
            return True
        if self.on_notice is OnNotice.SHRINK and self._shrink(job, notice, reason):
            return True
        return self._requeue(job, notice, reason)

    def _comment(self, job: str, text: str) -> None:
        """The job's AdminComment says why the agent handed it back (best effort)."""
        result = self._write("update", f"jobid={job}", f"admincomment={text}")
        if not result.ok:
            log.warning("slurm_job_comment_failed", job=job, error=str(result.error()))

    def _requeue(self, job: str, notice: Notice | None, why: str) -> bool:
        comment = self._why(notice, "requeued")
        result = self._write("requeue", job)
        if not result.ok:
            if any(m in (result.err + result.out).lower() for m in _GONE):
                log.info("slurm_job_gone", job=job, node=self.node_name, detail=result.err.strip())
                return True
            log.warning(
                "slurm_requeue_refused",
                job=job,
                node=self.node_name,
                why=why,
                error=str(result.error()),
            )
            return False
        self._comment(job, comment)
        log.warning(
            "slurm_job_requeued",
            job=job,
            node=self.node_name,
            action="requeue",
            why=why,
            reason=comment,
            dry_run=self.dry_run,
        )
        return True

    def _shrink(self, job: str, notice: Notice | None, why: str) -> bool:
        """The job's node list without this node, when it has others and Slurm takes it."""
        try:
            listed = scontrol.fields(self._read("-o", "show", "job", job)).get("NodeList", "")
            hosts = self._read("show", "hostnames", listed).split() if listed else []
        except SlurmError as exc:
            log.warning("slurm_shrink_unknown", job=job, node=self.node_name, error=str(exc))
            return False
        rest = [h for h in hosts if h != self.node_name]
        if not rest or len(rest) == len(hosts):
            log.info("slurm_shrink_impossible", job=job, node=self.node_name, nodes=hosts)
            return False
        # The comment goes first: right after a resize Slurm takes no update of the job for a
        # while ("the DB index is being set"); a refused shrink is requeued, with its own.
        comment = self._why(notice, "shrunk")
        self._comment(job, comment)
        result = self._write("update", f"jobid={job}", f"nodelist={','.join(rest)}")
        if not result.ok:
            log.warning(
                "slurm_shrink_refused", job=job, node=self.node_name, error=str(result.error())
            )
            return False
        log.warning(
            "slurm_job_shrunk",
            job=job,
            node=self.node_name,
            action="shrink",
            nodes=rest,
            why=why,
            reason=comment,
            dry_run=self.dry_run,
        )
        return True

    def _why(self, notice: Notice | None, how: str) -> str:
        if notice is None:
            return f"{scontrol.OURS} {how} off {self.node_name}"
        return scontrol.handback_comment(self.node_name, notice, how)

    def delete(self, pod: Pod, grace_seconds: int) -> bool:
        """The last resort at the deadline: the job was handed back already (or left to Slurm
        with ``none``); nothing more is done to it."""
        log.warning(
            "slurm_job_still_on_node",
            job=scontrol.job_of(pod.key),
            node=self.node_name,
            on_notice=self.on_notice.value,
        )
        return True
