"""Kubernetes-side signals: node taints and pod warnings that announce a removal become notices.

Platforms that warn the node rather than the VM (a cluster autoscaler scaling down, Karpenter
consolidating, a platform's own termination handler) mark it with a taint. Each configured taint
key present on the node is a notice (id ``kube-taint-<key>``) with a deadline ``lead`` after it
was first seen; the taint's removal withdraws it. The agent's own ``shoal.dev/revoking`` taint
is never one of them.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Final

from nodeagent.events import EventId, Kind, Notice, PodKey, PodUid
from nodeagent.providers.base import (
    Clock,
    HttpSettings,
    Sink,
    Unreachable,
    poll_forever,
    report,
    wall_clock,
)

DEFAULT_TAINTS: Final = (
    "ToBeDeletedByClusterAutoscaler",
    "karpenter.sh/disrupted",
    "karpenter.sh/disruption",
    "cloud.google.com/impending-node-termination",
)


@dataclass(slots=True)
class KubeTaintProvider:
    #: Blocking read of the node's (key, value) taints (run in a worker thread).
    read_taints: Callable[[], list[tuple[str, str]]]
    keys: frozenset[str] = frozenset(DEFAULT_TAINTS)
    lead: timedelta = timedelta(minutes=2)
    interval: float = 2.0
    clock: Clock = wall_clock
    rng: random.Random = field(default_factory=random.Random)
    name: str = "kubernetes"

    async def watch(self, sink: Sink) -> None:
        settings = HttpSettings("", interval=self.interval)

        async def tick() -> None:
            await report(sink, "kubernetes/taints", self.taints)

        await poll_forever(settings, self.rng, tick)

    async def taints(self) -> Sequence[Notice]:
        try:
            taints = await asyncio.to_thread(self.read_taints)
        except Exception as exc:
            raise Unreachable(f"read node taints: {exc}") from exc
        now = self.clock()
        return [
            Notice(
                event_id=EventId(f"kube-taint-{key}"),
                source=self.name,
                channel="kubernetes/taints",
                kind=Kind.TERMINATE,
                deadline=now + self.lead,
                reason=f"node taint {key}={value}".rstrip("="),
                upstream_id=None,
            )
            for key, value in sorted(set(taints))
            if key in self.keys
        ]

    def stale_after(self) -> float:
        return max(30.0, 10 * self.interval)

    async def acknowledge(self, notice: Notice) -> None:
        """Nothing to acknowledge: the platform removes the node when it is empty."""

    async def aclose(self) -> None:
        """Nothing to close."""


@dataclass(slots=True)
class KubePodProvider:
    """Pods warned by the platform (a configured pod condition or Event reason, e.g. the
    pre-release event that ACK/ACS give BestEffort pods minutes before reclaiming them): each
    such pod gets a notice scoped to it, ``lead`` after the warning was first seen."""

    #: Blocking read of (pod, uid, what) for the warned pods on this node.
    read_signals: Callable[[], Sequence[tuple[PodKey, PodUid, str]]]
    lead: timedelta = timedelta(minutes=5)
    interval: float = 2.0
    clock: Clock = wall_clock
    rng: random.Random = field(default_factory=random.Random)
    name: str = "kubernetes"

    async def watch(self, sink: Sink) -> None:
        settings = HttpSettings("", interval=self.interval)

        async def tick() -> None:
            await report(sink, "kubernetes/pods", self.pods)

        await poll_forever(settings, self.rng, tick)

    async def pods(self) -> Sequence[Notice]:
        try:
            signals = await asyncio.to_thread(self.read_signals)
        except Exception as exc:
            raise Unreachable(f"read pod signals: {exc}") from exc
        now = self.clock()
        notices: dict[EventId, Notice] = {}
        for key, uid, what in signals:
            event_id = EventId(f"kube-pod-{uid}")
            if event_id not in notices:
                notices[event_id] = Notice(
                    event_id=event_id,
                    source=self.name,
                    channel="kubernetes/pods",
                    kind=Kind.PREEMPT,
                    deadline=now + self.lead,
                    reason=f"platform warning on {key}: {what}",
                    scope=frozenset({key}),
                )
        return list(notices.values())

    def stale_after(self) -> float:
        return max(30.0, 10 * self.interval)

    async def acknowledge(self, notice: Notice) -> None:
        """Nothing to acknowledge."""

    async def aclose(self) -> None:
        """Nothing to close."""
