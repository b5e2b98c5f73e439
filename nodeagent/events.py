"""Value types the agent's core works on: notices, the pods on the node, and the actions due.

Everything here is a frozen value. Providers turn raw metadata into :class:`Notice`; the
Kubernetes adapter turns pod objects into :class:`Pod`; :mod:`nodeagent.store` decides which
:data:`Action` is due and the adapters carry it out.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import NewType

#: A notice's stable identity (the same cloud event always gets the same id, across restarts).
EventId = NewType("EventId", str)
#: ``namespace/name`` of a pod.
PodKey = NewType("PodKey", str)
#: A pod's ``metadata.uid``: a pod re-created under the same name is a different pod.
PodUid = NewType("PodUid", str)


class Kind(StrEnum):
    """What the cloud (or the GPU) is about to do to the machine."""

    TERMINATE = "terminate"
    STOP = "stop"
    HIBERNATE = "hibernate"
    PREEMPT = "preempt"
    REBOOT = "reboot"
    REDEPLOY = "redeploy"
    FREEZE = "freeze"
    MAINTENANCE = "maintenance"
    REBALANCE = "rebalance"
    GPU_FAULT = "gpu-fault"


@dataclass(frozen=True, slots=True)
class Notice:
    """One revocation notice as a provider saw it.

    ``channel`` is the provider's feed the notice came from (``aws/spot``, ``gcp/preempted``...):
    a later successful read of the same channel without this id withdraws it.
    ``disruptive`` notices make workers leave; the others (an AWS rebalance recommendation, a GCP
    live migration) only keep new pods away from the node. ``upstream_id`` is the cloud's id to
    acknowledge once the workers are out (Azure Scheduled Events); ``None`` when the cloud has
    no acknowledgement.
    """

    event_id: EventId
    source: str
    channel: str
    kind: Kind
    deadline: datetime
    reason: str
    disruptive: bool = True
    upstream_id: str | None = None
    scope: frozenset[PodKey] | None = None

    def __post_init__(self) -> None:
        if self.deadline.tzinfo is None:
            raise ValueError("a notice's deadline must be timezone-aware")


@dataclass(frozen=True, slots=True)
class Pod:
    """A pod bound to this node, as far as the core needs to know it.

    ``worker``: a training worker (it belongs to a gang or opened a notice watch); workers are
    evicted first. ``daemon``: a DaemonSet or mirror pod, never evicted. ``leave_by`` comes from
    the pod's ``shoal.dev/leave-by`` annotation: the durable record of what the agent already told
    the pod, so a restarted agent does not repeat a notice. ``leaving`` is true once the pod has a
    deletion timestamp.
    """

    key: PodKey
    uid: PodUid
    worker: bool = True
    daemon: bool = False
    leave_by: datetime | None = None
    leaving: bool = False


# --- Actions: what the store says is due; adapters carry them out and report back. ---------


@dataclass(frozen=True, slots=True)
class Tracked:
    """A notice as the agent keeps it: when it was first seen, whether the cloud was acked.

    This is what the node's ``shoal.dev/revocation`` annotation records, so a restarted agent
    picks up exactly where it left off.
    """

    notice: Notice
    first_seen: datetime
    upstream_acked: bool = False


@dataclass(frozen=True, slots=True)
class SyncNode:
    """Make the node's taint and ``shoal.dev/revocation`` annotation describe ``notices``.

    An empty tuple means: remove the taint and the annotation (every notice was withdrawn).
    The first notice is the most urgent one and names the taint's value (its source).
    """

    notices: tuple[Tracked, ...]


@dataclass(frozen=True, slots=True)
class NotifyPod:
    """Annotate the pod ``shoal.dev/leave-by``, record an Event, and tell its workers."""

    pod: Pod
    notice: Notice


@dataclass(frozen=True, slots=True)
class WithdrawPod:
    """The notice the pod was under is gone: remove its annotation and tell its workers."""

    pod: Pod


@dataclass(frozen=True, slots=True)
class EvictPod:
    """Evict through the Eviction API (PDBs respected). ``why``: acknowledged or deadline."""

    pod: Pod
    notice: Notice
    why: str


@dataclass(frozen=True, slots=True)
class DeletePod:
    """Last resort right before the deadline: delete with a short grace period."""

    pod: Pod
    notice: Notice


@dataclass(frozen=True, slots=True)
class AckUpstream:
    """Tell the cloud it may go ahead (Azure ``StartRequests``)."""

    notice: Notice


Action = SyncNode | NotifyPod | WithdrawPod | EvictPod | DeletePod | AckUpstream


def utc(moment: datetime) -> datetime:
    """``moment`` as an aware UTC datetime (naive values are taken to be UTC)."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def rfc3339(moment: datetime) -> str:
    """``2026-11-30T10:00:00Z`` (second precision, as Kubernetes writes times)."""
    return utc(moment).strftime("%Y-%m-%dT%H:%M:%SZ")


#: The times the agent believes. Clouds and the agent itself write times close to now; a time
#: outside these bounds is garbage, and near the ends of ``datetime``'s range the store's
#: margin arithmetic (``deadline - evict_margin``) would overflow.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def in_range(moment: datetime, text: object) -> datetime:
    """``moment`` when it lies between :data:`EARLIEST` and :data:`LATEST`; else ``ValueError``."""
    if not EARLIEST <= moment < LATEST:
        raise ValueError(f"time out of range ({EARLIEST.year} to {LATEST.year}): {text!r}")
    return moment


def parse_rfc3339(text: str) -> datetime:
    """Parse an RFC 3339 / ISO 8601 time between :data:`EARLIEST` and :data:`LATEST`; raises
    ``ValueError`` for anything else."""
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"time without a zone: {text!r}")
    try:
        moment = parsed.astimezone(UTC)
    except OverflowError as exc:
        raise ValueError(f"time out of range: {text!r}") from exc
    return in_range(moment, text)
