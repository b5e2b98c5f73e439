"""Value types the agent's core works on: notices, the pods on the node, and the actions due.

Everything here is a frozen value. Providers turn raw metadata into :class:`Notice`; the
Kubernetes adapter turns pod objects into :class:`Pod`; :mod:`nodeagent.core.store` decides which
:data:`Action` is due and the adapters carry it out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import NewType

from contracts.times import format_time, parse_time

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
    #: The scheduler takes the pod back for a gang that needs its room (``shoal.dev/leave-by``
    #: with ``shoal.dev/reclaimed-for``): the scheduler evicts it at the deadline.
    RECLAIM = "reclaim"


#: The source and channel of the notices the scheduler gives, read from this node's pods.
SCHEDULER_SOURCE = "scheduler"
RECLAIM_CHANNEL = "scheduler/reclaim"


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

    @property
    def reclaim(self) -> bool:
        """The scheduler's reclaim: it writes the pod's annotation and evicts at the deadline;
        the agent tells the workers and evicts early only on their acknowledgement."""
        return self.kind is Kind.RECLAIM


@dataclass(frozen=True, slots=True)
class Pod:
    """A pod bound to this node, as far as the core needs to know it.

    ``worker``: a training worker (it belongs to a gang or opened a notice watch); workers are
    evicted first. ``daemon``: a DaemonSet or mirror pod, never evicted. ``leave_by`` comes from
    the pod's ``shoal.dev/leave-by`` annotation: the durable record of what the agent already told
    the pod, so a restarted agent does not repeat a notice. ``leaving`` is true once the pod has a
    deletion timestamp. ``reclaimed_for`` is the scheduler's ``shoal.dev/reclaimed-for``: the
    gang the scheduler takes the pod back for, its ``leave_by`` then being the scheduler's.
    ``checkpoint_seconds`` is how long the pod says its checkpoint takes
    (``shoal.dev/checkpoint-seconds``; None when it does not say, or says it wrongly).
    ``warning`` describes a pod condition the agent was told announces the pod's removal
    (``--kube-pod-conditions``), when the pod carries one.
    """

    key: PodKey
    uid: PodUid
    worker: bool = True
    daemon: bool = False
    leave_by: datetime | None = None
    leaving: bool = False
    reclaimed_for: str | None = None
    checkpoint_seconds: float | None = None
    warning: str | None = None


#: (key, value) of each taint on this node.
NodeTaints = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class PodEvent:
    """A Kubernetes Event about a pod (``uid`` is the Event's own, ``pod`` the pod's)."""

    uid: str
    pod: PodUid
    reason: str
    message: str


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
class Late:
    """A notice that reached the agent with less time than the eviction margin: first ``seen``
    at a moment when its ``deadline`` was less than ``margin`` away, or already gone. Its pods
    are evicted at once (never deleted first: the Eviction API's ``DisruptionTarget`` condition
    is what a Job's ``podFailurePolicy`` reads), and the pod's Event says why."""

    notice: Notice
    seen: datetime
    margin: timedelta

    @property
    def passed(self) -> bool:
        return self.seen >= self.notice.deadline

    def message(self) -> str:
        """What the pod's Event says: how late the notice came, and what the agent did."""
        n = self.notice
        what = f"{n.source} {n.kind.value} ({n.reason}, event {n.event_id})"
        if self.passed:
            return (
                f"The deadline {rfc3339(n.deadline)} had passed when the agent saw it "
                f"({rfc3339(self.seen)}): {what}; evicted at once"
            )
        left = math.floor((n.deadline - self.seen).total_seconds())
        return (
            f"Only {left} s left, less than the {self.margin.total_seconds():g} s margin, when "
            f"the agent saw the notice (leave by {rfc3339(n.deadline)}): {what}; evicted at once"
        )


@dataclass(frozen=True, slots=True)
class EvictPod:
    """Evict through the Eviction API (PDBs respected). ``why``: acknowledged, deadline or
    drain; ``late`` when the notice came with less time than the margin (said on the pod)."""

    pod: Pod
    notice: Notice
    why: str
    late: Late | None = None


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


# The times the agent writes and reads are those of the shared codec (contracts/times.py):
# UTC, second precision, between EARLIEST and LATEST.
rfc3339 = format_time
parse_rfc3339 = parse_time
