"""Stop every rank of a torch.distributed job at one step when any of them is told to leave.

A data-parallel job can only stop as a whole: a rank that stops alone leaves the others blocked
in a collective and the checkpoint torn. So each rank hears its own pod's notice in a background
thread, and once per step the ranks agree, with one all-reduce of a single int64, on the step
after which all of them stop::

    from shoal_worker.distributed import StopStep, resume, save_checkpoint

    start = resume(ckpt_dir, model, optimizer)        # 0, or the step after the last checkpoint
    with StopStep.from_env() as stopper:
        for step in range(start, total):
            train_one_step(step)
            if stopper.check(step) is not None:           # every rank gets the same answer
                stopper.leave(step, lambda s: save_checkpoint(ckpt_dir, s, model, optimizer))

:meth:`StopStep.check` also reports the job's progress to the node agent on its own (the step,
the mean step time, the last complete checkpoint and how long checkpoints take; see
:mod:`shoal_worker.progress`), so that the scheduler, when it must take GPUs back, reclaims the
members that lose the least. Checkpoints taken through :meth:`StopStep.checkpoint` (or told with
:meth:`StopStep.saved`) are what it reports as complete.

:meth:`StopStep.leave` saves on every rank, acknowledges the checkpoint to the node agent from
the pods under notice, and ends the process the way torchrun's elastic agent turns into a
membership change: the leaving pod's torchrun is stopped with SIGTERM, by the kubelet when the
agent evicts the acknowledged pod or else by the worker itself (a launcher stopped by a signal
keeps the rendezvous open), and every other rank exits with :data:`EXIT_REJOIN`, which
its torchrun answers by restarting its workers into a new rendezvous round without the pod that
left (one of ``--max-restarts``). The restarted script calls :func:`resume` and goes on from the
step after the checkpoint: no step is lost.

This module needs torch (``pip install 'shoal-worker[torch]'``); the node agent never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

import grpc
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from shoal_worker import contract
from shoal_worker.contract import parse_time
from shoal_worker.progress import ProgressReporter, StepTimer
from shoal_worker.watcher import (
    LeaveNotice,
    NoticeClient,
    NoticeRefused,
    PodIdentity,
    short_notice,
)

log = logging.getLogger(__name__)

#: The exit status of a rank that stopped because another pod left: torchrun restarts it into a
#: new rendezvous round (EX_TEMPFAIL, "try again").
EXIT_REJOIN = 75
#: The exit status of a leaving rank that runs without torchrun (nothing to tell).
EXIT_LEFT = 0
#: No rank holds a notice.
NO_STOP = -1

_STEP_DIR = re.compile(r"^step-(\d+)$")
_COMPLETE = ".metadata"  # written by torch.distributed.checkpoint after every rank's shards


class NoticeFlag:
    """This pod's "leave" state, kept current by a daemon thread: the watch on the agent's
    socket (reconnecting with a backoff while the agent is away) and, where
    ``SHOAL_LEAVE_BY_FILE`` names the Downward API file of ``shoal.dev/leave-by``, that file.
    Reading it never blocks the training loop."""

    def __init__(
        self,
        client: NoticeClient | None,
        leave_by_file: str | None = None,
        poll_seconds: float = 1.0,
    ) -> None:
        self.client = client
        self.leave_by_file = leave_by_file
        self.poll_seconds = poll_seconds
        self._socket: LeaveNotice | None = None
        self._file: LeaveNotice | None = None
        self._closed = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="shoal-notice", daemon=True)

    def start(self) -> NoticeFlag:
        self._thread.start()
        return self

    @property
    def notice(self) -> LeaveNotice | None:
        """The notice this pod holds now, if any (the socket's first)."""
        return self._socket or self._file

    def close(self) -> None:
        self._closed.set()
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(loop.stop)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        tasks = []
        if self.client is not None:
            tasks.append(loop.create_task(self._watch(self.client)))
        if self.leave_by_file:
            tasks.append(loop.create_task(self._poll(self.leave_by_file)))
        if not self._closed.is_set():
            loop.run_forever()
        for task in tasks:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.close()

    async def _watch(self, client: NoticeClient) -> None:
        backoff = 0.5
        while not self._closed.is_set():
            try:
                async for update in client.watch():
                    self._socket = update if update.leave else None
                    backoff = 0.5
            except (NoticeRefused, grpc.aio.AioRpcError) as exc:
                log.warning("notice watch ended (%s); watching again in %.1f s", exc, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30.0)

    async def _poll(self, path: str) -> None:
        while not self._closed.is_set():
            self._file = read_leave_by(path)
            await asyncio.sleep(self.poll_seconds)


def read_leave_by(path: str) -> LeaveNotice | None:
    """The notice in a Downward API file of ``shoal.dev/leave-by`` (empty until one is set)."""
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    if not text:
        return None
    try:
        leave_by = parse_time(text)
    except ValueError:
        log.warning("%s holds %r, not a time; treating it as a notice to leave now", path, text)
        leave_by = None
    return LeaveNotice(state="leave", source="annotation", leave_by=leave_by)


@dataclass(frozen=True, slots=True)
class Stop:
    """What the ranks agreed: the step after which all stop, and which nodes (torchrun's
    ``GROUP_RANK``, one per pod; the rank without torchrun) leave."""

    step: int
    leaving_nodes: frozenset[int]
    node: int

    @property
    def leaving(self) -> bool:
        """Whether this rank's pod is one of those told to leave."""
        return self.node in self.leaving_nodes


class StopStep:
    """Agrees, once per :meth:`check`, on the step after which every rank stops.

    ``flag`` is this pod's notice (``None``: this rank watches nothing; with torchrun only local
    rank 0 of each pod needs to). ``group`` is the process group to agree in (the default one).
    ``every`` checks only every that many steps, to spend even less on the collective.
    ``eviction_wait``: how long a leaving pod, once acknowledged, waits for its eviction (the
    agent evicts at once after an acknowledgement; the kubelet's SIGTERM stops torchrun and the
    pod carries the ``DisruptionTarget`` condition a Job's ``podFailurePolicy`` can ignore)
    before it stops its torchrun itself.
    ``checkpoint_seconds``: how long a checkpoint takes (the pod's
    ``shoal.dev/checkpoint-seconds``); a notice that gives less is logged as a warning, with
    what will be lost, before the save. ``last_checkpoint``: the step of the last complete
    checkpoint (-1 for none; what :func:`resume` returned, minus one), kept by :meth:`saved`.
    ``progress``: where this rank reports its progress (``None``: it does not; with
    :meth:`from_env`, local rank 0 of each pod reports).
    """

    def __init__(
        self,
        flag: NoticeFlag | None,
        group: dist.ProcessGroup | None = None,
        every: int = 1,
        eviction_wait: float = 10.0,
        *,
        checkpoint_seconds: float | None = None,
        last_checkpoint: int | None = None,
        progress: ProgressReporter | None = None,
    ) -> None:
        self.flag = flag
        self.group = group
        self.every = every
        self.eviction_wait = eviction_wait
        self.checkpoint_seconds = checkpoint_seconds
        self.last_checkpoint = last_checkpoint
        self.progress = progress
        #: When the last complete checkpoint completed (seconds since the epoch; None: not
        #: known) and how long the last one took (None: not measured).
        self.checkpoint_at: float | None = None
        self.measured_checkpoint_seconds: float | None = None
        self.steps = StepTimer()
        self._step = -1
        self.stop: Stop | None = None
        self._device = _collective_device(group)

    @classmethod
    def from_env(
        cls,
        group: dist.ProcessGroup | None = None,
        every: int = 1,
        eviction_wait: float = 10.0,
        *,
        last_checkpoint: int | None = None,
    ) -> StopStep:
        """The pod's identity from ``POD_NAMESPACE``/``POD_NAME``/``POD_UID``, the socket from
        ``SHOAL_SOCKET``, the file from ``SHOAL_LEAVE_BY_FILE``, the checkpoint time from
        ``SHOAL_CHECKPOINT_SECONDS``; only ``LOCAL_RANK`` 0 watches."""
        options: dict[str, Any] = {
            "checkpoint_seconds": _checkpoint_seconds_from_env(),
            "last_checkpoint": last_checkpoint,
        }
        if int(os.environ.get("LOCAL_RANK", "0")) != 0:
            return cls(None, group, every, eviction_wait, **options)
        try:
            client: NoticeClient | None = NoticeClient.from_env()
        except NoticeRefused as exc:
            log.warning("no notice socket for this pod: %s", exc)
            client = None
        leave_by_file = os.environ.get(contract.LEAVE_BY_FILE_ENV) or None
        if client is None and leave_by_file is None:
            return cls(None, group, every, eviction_wait, **options)
        flag = NoticeFlag(client, leave_by_file).start()
        if client is not None:
            options["progress"] = ProgressReporter(client)
        return cls(flag, group, every, eviction_wait, **options)

    def saved(self, step: int, seconds: float | None = None) -> None:
        """A checkpoint of ``step`` is complete, having taken ``seconds`` (call it after
        checkpoints of your own; :meth:`checkpoint` calls it)."""
        self.last_checkpoint = step
        self.checkpoint_at = time.time()
        if seconds is not None:
            self.measured_checkpoint_seconds = seconds
        self.report(max(step, self._step))

    def checkpoint(self, step: int, save: Callable[[int], object]) -> None:
        """Save the checkpoint of ``step`` with ``save`` (collective, such as
        :func:`save_checkpoint`), timed, and report it complete."""
        began = time.monotonic()
        save(step)
        took = time.monotonic() - began
        self.steps.paused(took)
        self.saved(step, took)

    def report(self, step: int) -> None:
        """Report ``step`` and the last complete checkpoint to the agent (paced; never blocks).
        :meth:`check` calls it every step."""
        if self.progress is None:
            return
        last = self.last_checkpoint
        checkpoint_step = 0 if last is None or last < 0 else min(last, step)
        took = self.measured_checkpoint_seconds
        if took is None:
            took = self.checkpoint_seconds
        self.progress.report(
            step,
            step_seconds=self.steps.mean or 0.0,
            checkpoint_step=checkpoint_step,
            checkpoint_at=self.checkpoint_at if checkpoint_step == last else None,
            checkpoint_seconds=min(took or 0.0, contract.MAX_CHECKPOINT_SECONDS),
        )

    def __enter__(self) -> StopStep:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self.flag is not None:
            self.flag.close()
        if self.progress is not None:
            self.progress.close()

    @property
    def noticed(self) -> bool:
        return self.flag is not None and self.flag.notice is not None

    def check(self, step: int) -> int | None:
        """Call on every rank after ``step``. Returns the agreed stop step (``step`` itself: all
        stop now) once any rank's pod holds a notice, else ``None``. One all-reduce (MAX) of one
        int64: a rank under notice offers ``step``, the others -1."""
        if self.stop is not None:
            return self.stop.step
        if step > self._step:
            self.steps.stepped(step, time.monotonic())
            self._step = step
            self.report(step)
        if step % self.every:
            return None
        offer = torch.tensor([step if self.noticed else NO_STOP], dtype=torch.int64)
        offer = offer.to(self._device)
        dist.all_reduce(offer, op=dist.ReduceOp.MAX, group=self.group)
        agreed = int(offer.item())
        if agreed == NO_STOP:
            return None
        self.stop = self._who_leaves(agreed)
        return agreed

    def _who_leaves(self, step: int) -> Stop:
        # torchrun's node rank is the pod; without torchrun, one process per pod is assumed.
        node = int(os.environ.get("GROUP_RANK", str(dist.get_rank(self.group))))
        mine = torch.tensor([node, int(self.noticed)], dtype=torch.int64).to(self._device)
        every = [torch.zeros_like(mine) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(every, mine, group=self.group)
        leaving = frozenset(int(t[0]) for t in every if int(t[1]))
        return Stop(step=step, leaving_nodes=leaving, node=node)

    def leave(self, step: int, save: Callable[[int], object]) -> NoReturn:
        """Save the checkpoint at ``step`` on every rank (``save`` is collective, such as
        :func:`save_checkpoint`), acknowledge it from each pod under notice, and exit so that
        torchrun starts a new round without the pods that leave."""
        stop = self.stop
        if stop is None or stop.step != step:
            raise RuntimeError(f"leave({step}) without an agreed stop at that step")
        stopping = _LauncherStop() if stop.leaving and _under_torchrun() else None
        if self.flag is not None:
            short = short_notice(
                self.flag.notice,
                datetime.now(UTC),
                self.checkpoint_seconds,
                step,
                self.last_checkpoint,
            )
            if short is not None:
                # Saved all the same: the checkpoint may be quicker than declared, and one cut
                # short is never loaded (its metadata, written last, is missing).
                log.warning(short)
        self.checkpoint(step, save)
        if stop.leaving and self.flag is not None and self.flag.client is not None:
            acknowledge(self.flag.client, step)
        if stopping is not None and int(os.environ.get("LOCAL_RANK", "0")) == 0:
            stopping.stop_launcher(self.eviction_wait)
        # Past this barrier every leaving pod's torchrun is stopping: none of them can answer
        # the others' new round by restarting its workers into it.
        dist.barrier(group=self.group)
        self.close()
        dist.destroy_process_group()
        sys.exit(EXIT_LEFT if stop.leaving else EXIT_REJOIN)


def _checkpoint_seconds_from_env() -> float | None:
    text = os.environ.get(contract.CHECKPOINT_SECONDS_ENV)
    if not text:
        return None
    try:
        return contract.parse_checkpoint_seconds(text)
    except ValueError as exc:
        log.warning("%s: %s; short notices are not told", contract.CHECKPOINT_SECONDS_ENV, exc)
        return None


def _collective_device(group: dist.ProcessGroup | None) -> torch.device:
    backend = dist.get_backend(group)
    if backend == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def acknowledge(client: NoticeClient, step: int, attempts: int = 5) -> None:
    """Report the checkpoint at ``step`` to the agent; a refusal is logged, not raised (the pod
    leaves either way, and the agent evicts it at the deadline)."""
    for attempt in range(attempts):
        try:
            asyncio.run(client.acknowledge(step))
            return
        except NoticeRefused as exc:
            log.warning("the agent refused the acknowledgement of step %d: %s", step, exc)
            return
        except grpc.aio.AioRpcError as exc:
            log.warning("acknowledging step %d failed (%s), attempt %d", step, exc, attempt + 1)
            time.sleep(0.2 * 2**attempt)


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ


class _LauncherStop:
    """Waits for this pod's eviction to stop its torchrun, or stops it with SIGTERM, and holds
    the worker until torchrun passes the signal on (it then stops its workers and exits without
    closing the rendezvous).

    The handler is installed before anything is sent, so every local rank of a leaving pod
    survives the signal until it has passed the final barrier."""

    def __init__(self) -> None:
        self.heard = threading.Event()
        signal.signal(signal.SIGTERM, lambda signum, frame: self.heard.set())

    def stop_launcher(self, eviction_wait: float, wait_seconds: float = 30.0) -> None:
        if self.heard.wait(eviction_wait):
            return  # evicted: the kubelet stopped torchrun, which passed the signal on
        os.kill(os.getppid(), signal.SIGTERM)
        if not self.heard.wait(wait_seconds):
            log.warning("torchrun did not pass SIGTERM on within %.0f s", wait_seconds)


def checkpoint_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step}"


def latest_checkpoint(root: str | Path) -> tuple[int, Path] | None:
    """The highest step whose checkpoint is complete (its metadata is written last)."""
    found: list[tuple[int, Path]] = []
    base = Path(root)
    if not base.is_dir():
        return None
    for entry in base.iterdir():
        match = _STEP_DIR.match(entry.name)
        if match and (entry / _COMPLETE).is_file():
            found.append((int(match.group(1)), entry))
    return max(found) if found else None


def save_checkpoint(
    root: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
) -> Path:
    """``torch.distributed.checkpoint.save`` of the model, the optimizer and the step into
    ``root/step-N`` (collective: every rank calls it)."""
    model_state, optim_state = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_state, "optim": optim_state, "step": step}
    path = checkpoint_dir(root, step)
    dcp_save(state, checkpoint_id=str(path))
    return path


def resume(root: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load the latest complete checkpoint into ``model`` and ``optimizer`` (collective) and
    return the next step to train: 0 without a checkpoint. Works across world sizes."""
    latest = latest_checkpoint(root)
    if latest is None:
        return 0
    _, path = latest
    model_state, optim_state = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_state, "optim": optim_state, "step": -1}
    dcp_load(state, checkpoint_id=str(path))
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    return int(state["step"]) + 1


__all__ = [
    "EXIT_LEFT",
    "EXIT_REJOIN",
    "NoticeFlag",
    "PodIdentity",
    "Stop",
    "StopStep",
    "latest_checkpoint",
    "read_leave_by",
    "resume",
    "save_checkpoint",
]
