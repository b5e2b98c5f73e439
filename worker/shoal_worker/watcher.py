"""Async client for ``shoal.v1.Notices`` (used by training code, the CLI and the tests)."""

from __future__ import annotations

import math
import os
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc

from shoal_worker import contract
from shoal_worker.protocol import notices_pb2 as pb
from shoal_worker.protocol import rpc

DEFAULT_SOCKET = contract.DEFAULT_SOCKET


class NoticeRefused(Exception):
    """The agent refused the call (the pod is not on its node, or not under notice)."""


class AgentBusy(NoticeRefused):
    """The agent holds as many watches as it allows (in total or for this pod), or this watch
    fell too far behind: watch again later."""


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
    def __init__(self, pod: PodIdentity, socket_path: str = DEFAULT_SOCKET) -> None:
        self.pod = pod
        self.target = f"unix:{socket_path}"

    @classmethod
    def from_env(cls) -> NoticeClient:
        return cls(PodIdentity.from_env(), os.environ.get(contract.SOCKET_ENV, DEFAULT_SOCKET))

    def _identity(self) -> pb.PodIdentity:
        return pb.PodIdentity(namespace=self.pod.namespace, name=self.pod.name, uid=self.pod.uid)

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
                if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
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
                raise
        if not reply.accepted:
            raise NoticeRefused(str(reply.detail))
        return str(reply.detail)
