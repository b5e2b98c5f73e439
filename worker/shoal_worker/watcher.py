"""Async client for ``shoal.v1.Notices`` (used by training code, the CLI and the tests)."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc

from shoal_worker import contract
from shoal_worker.progress import Report, request
from shoal_worker.protocol import notices_pb2 as pb
from shoal_worker.protocol import rpc

log = logging.getLogger(__name__)

DEFAULT_SOCKET = contract.DEFAULT_SOCKET


class NoticeRefused(Exception):
    """The agent refused the call (the pod is not on its node, or not under notice)."""


class AgentBusy(NoticeRefused):
    """The agent holds as many watches as it allows (in total or for this pod), or this watch
    fell too far behind: watch again later."""


#: What a refused watch ends with: no such pod here, no identity, or (on a Slurm node) a
#: process that is not in the job step it names.
_REFUSALS = (
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.PERMISSION_DENIED,
)


@dataclass(frozen=True, slots=True)
class PodIdentity:
    namespace: str
    name: str
    uid: str

    @classmethod
    def from_env(cls) -> PodIdentity:
        try:
            return cls(
                os.environ[contract.POD_NAMESPACE_ENV],
                os.environ[contract.POD_NAME_ENV],
                os.environ[contract.POD_UID_ENV],
            )
        except KeyError as exc:
            raise NoticeRefused(
                f"{exc.args[0]} is not set: expose it with the Downward API"
            ) from exc


@dataclass(frozen=True, slots=True)
class SlurmStep:
    """A Slurm job step (protocol 0.3.0): what a worker on a Slurm node names itself by. The
    agent checks it with Slurm (the calling process must be in this step on its node)."""

    job_id: str
    step_id: str
    node: str

    @classmethod
    def from_env(cls) -> SlurmStep:
        job = os.environ.get(contract.SLURM_JOB_ID_ENV, "")
        node = os.environ.get(contract.SLURM_NODE_ENV, "")
        if not job or not node:
            missing = contract.SLURM_JOB_ID_ENV if not job else contract.SLURM_NODE_ENV
            raise NoticeRefused(f"{missing} is not set: run this inside a Slurm job step")
        step = next(
            (os.environ[v] for v in contract.SLURM_STEP_ID_ENVS if os.environ.get(v)),
            contract.SLURM_BATCH_STEP,
        )
        return cls(job, step, node)


#: Who a worker says it is: a pod (Kubernetes) or a job step (Slurm).
Identity = PodIdentity | SlurmStep

_POD_ENVS = (contract.POD_NAMESPACE_ENV, contract.POD_NAME_ENV, contract.POD_UID_ENV)


def identity_from_env() -> Identity:
    """The pod's identity (Downward API); a Slurm job step's when ``SLURM_JOB_ID`` is set and
    no pod identity is."""
    if os.environ.get(contract.SLURM_JOB_ID_ENV) and not any(os.environ.get(v) for v in _POD_ENVS):
        return SlurmStep.from_env()
    return PodIdentity.from_env()


def identity_message(who: Identity) -> pb.PodIdentity:
    """``who`` as the protocol's ``PodIdentity``."""
    if isinstance(who, SlurmStep):
        step = pb.SlurmStep(job_id=who.job_id, step_id=who.step_id, node=who.node)
        return pb.PodIdentity(slurm=step)
    return pb.PodIdentity(namespace=who.namespace, name=who.name, uid=who.uid)


@dataclass(frozen=True, slots=True)
class LeaveNotice:
    """One update: ``leave`` with a deadline, or nothing planned / withdrawn."""

    state: str  # none, leave, withdrawn
    event_id: str = ""
    kind: str = ""
    source: str = ""
    reason: str = ""
    leave_by: datetime | None = None

    @property
    def leave(self) -> bool:
        return self.state == "leave"


def short_notice(
    notice: LeaveNotice | None,
    now: datetime,
    checkpoint_seconds: float | None,
    step: int,
    last_checkpoint: int | None,
) -> str | None:
    """What a worker about to checkpoint ``step`` says when ``notice`` gives it less time than
    its checkpoint takes (``shoal.dev/checkpoint-seconds``); None when it gives enough, or when
    the notice has no deadline or the worker declares no checkpoint time. ``last_checkpoint``
    is the step of the last complete checkpoint (-1: none yet; None: not known)."""
    if notice is None or notice.leave_by is None or checkpoint_seconds is None:
        return None
    given = max(0, math.floor((notice.leave_by - now).total_seconds()))
    if given >= checkpoint_seconds:
        return None
    if last_checkpoint is None:
        lost = "the steps after the last checkpoint will be lost"
    elif last_checkpoint < 0:
        lost = f"steps 0 to {step} will be lost (no checkpoint yet)"
    else:
        lost = f"steps after {last_checkpoint} (the last checkpoint) will be lost"
    return (
        f"notice gives {given} s, checkpoint takes {checkpoint_seconds:g} s: unless the "
        f"checkpoint of step {step} completes sooner, {lost}"
    )


def _notice(raw: Any) -> LeaveNotice:
    state = {pb.Notice.LEAVE: "leave", pb.Notice.WITHDRAWN: "withdrawn"}.get(raw.state, "none")
    leave_by = (
        datetime.fromtimestamp(raw.leave_by_unix_ms / 1000, tz=UTC)
        if raw.leave_by_unix_ms
        else None
    )
    return LeaveNotice(
        state=state,
        event_id=raw.event_id,
        kind=raw.kind,
        source=raw.source,
        reason=raw.reason,
        leave_by=leave_by,
    )


class NoticeClient:
    """``pod``: the caller's identity, a pod or (on a Slurm node) a job step."""

    def __init__(self, pod: Identity, socket_path: str = DEFAULT_SOCKET) -> None:
        self.pod = pod
        self.target = f"unix:{socket_path}"
        #: False once the agent answered that it does not know the Progress call.
        self.progress_known = True

    @classmethod
    def from_env(cls) -> NoticeClient:
        """The identity from the environment (:func:`identity_from_env`: the pod's, or the Slurm
        job step's when there is no pod), the socket from ``SHOAL_SOCKET``."""
        return cls(identity_from_env(), os.environ.get(contract.SOCKET_ENV, DEFAULT_SOCKET))

    def _identity(self) -> pb.PodIdentity:
        return identity_message(self.pod)

    async def watch(self) -> AsyncGenerator[LeaveNotice, None]:
        """The pod's notice state now, then each change, until the agent goes away."""
        async with grpc.aio.insecure_channel(self.target) as channel:
            stub = rpc.NoticesStub(channel)
            call = stub.Watch(pb.WatchRequest(pod=self._identity()))
            try:
                async for raw in call:
                    yield _notice(raw)
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise AgentBusy(exc.details()) from exc
                if exc.code() in _REFUSALS:
                    raise NoticeRefused(exc.details()) from exc
                raise
            finally:
                call.cancel()

    async def acknowledge(self, step: int) -> str:
        """Checkpoint done at ``step``. Returns ``accepted``; raises :class:`NoticeRefused`
        (:class:`AgentBusy` when the agent has too many calls in flight)."""
        async with grpc.aio.insecure_channel(self.target) as channel:
            stub = rpc.NoticesStub(channel)
            try:
                reply = await stub.Acknowledge(
                    pb.AcknowledgeRequest(pod=self._identity(), step=step), timeout=10
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise AgentBusy(exc.details()) from exc
                if exc.code() is grpc.StatusCode.PERMISSION_DENIED:
                    raise NoticeRefused(exc.details()) from exc
                raise
        if not reply.accepted:
            raise NoticeRefused(str(reply.detail))
        return str(reply.detail)

    async def report_progress(self, report: Report) -> bool:
        """Send one progress report (no pacing: see
        :class:`shoal_worker.progress.ProgressReporter`). True when the agent took it; False
        when the agent is older than protocol 0.2.0 and does not know the call (logged once;
        nothing is sent after that). Raises :class:`NoticeRefused` when the agent refused it
        (the pod is not on its node, or the report is not valid)."""
        if not self.progress_known:
            return False
        async with grpc.aio.insecure_channel(self.target) as channel:
            stub = rpc.NoticesStub(channel)
            try:
                reply = await stub.Progress(request(self._identity(), report), timeout=10)
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                    self.progress_known = False
                    log.info(
                        "the node agent does not take progress reports (older than 0.2.0); "
                        "not reporting progress"
                    )
                    return False
                if exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise AgentBusy(exc.details()) from exc
                if exc.code() is grpc.StatusCode.INVALID_ARGUMENT:
                    raise NoticeRefused(exc.details()) from exc
                raise
        if not reply.accepted:
            raise NoticeRefused(str(reply.detail))
        return True
