"""Kubernetes-side signals: node taints and pod warnings that announce a removal become notices.

Platforms that warn the node rather than the VM (a cluster autoscaler scaling down, Karpenter
consolidating, a platform's own termination handler) mark it with a taint. Each configured taint
key present on the node is a notice (id ``kube-taint-<key>``) with a deadline ``lead`` after it
was first seen; the taint's removal withdraws it. The agent's own ``shoal.dev/revoking`` taint
is never one of them. The node is watched, not polled (its own Node, by field selector, through
:class:`nodeagent.adapters.follow.Mirror`: list, watch, list again on ``410 Gone``, resume a broken
watch), so an idle agent costs the API server one request every few minutes.

Platforms that warn the pod rather than the VM do it with an Event of a known reason
(:class:`KubeEventProvider`, watched the same way, one watch per reason) or a pod condition
(:class:`KubePodProvider`, seen by the agent's pod watch).

A watched signal is reported to the sink as soon as it changes, and again every ``interval``
while its watches are open (no request: what was watched is still current), so the channel's
read health (:mod:`nodeagent.wiring.channels`) says whether the watch is working; while a watch is
broken its error is reported instead.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Final, TypeVar

from nodeagent.adapters.follow import Mirror, WatchSettings
from nodeagent.adapters.providers.base import (
    Clock,
    HttpSettings,
    Unreachable,
    poll_forever,
    report,
    wall_clock,
)
from nodeagent.core.events import EventId, Kind, NodeTaints, Notice, Pod, PodEvent, PodUid
from nodeagent.core.ports import Feed, Sink

DEFAULT_TAINTS: Final = (
    "ToBeDeletedByClusterAutoscaler",
    "karpenter.sh/disrupted",
    "karpenter.sh/disruption",
    "cloud.google.com/impending-node-termination",
)

T = TypeVar("T")


async def _follow_reporting(
    sink: Sink,
    channel: str,
    mirrors: Sequence[Mirror[T]],
    notices: Callable[[], Sequence[Notice]],
    interval: float,
) -> None:
    """Run the mirrors' watches and report ``notices()`` on ``channel``: at once after each
    list or change (``notices`` is called then through the mirrors' ``changed``), and every
    ``interval`` while every watch is open; while one is failing (until the API server answers
    it again), its error."""
    tasks = [asyncio.create_task(m.follower.run(), name=m.follower.what) for m in mirrors]
    try:
        while True:
            await asyncio.sleep(interval)
            followers = [m.follower for m in mirrors]
            errors = [f.error for f in followers if f.error]
            if errors:
                sink.failed(channel, Unreachable(errors[0]))
            elif all(f.watching for f in followers):
                sink.observed(channel, notices())
    finally:
        for m in mirrors:
            m.follower.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass(slots=True)
class KubeTaintProvider:
    #: This node's taints, listed then watched (see
    #: :meth:`nodeagent.adapters.k8s.Cluster.node_feed`).
    feed: Feed[NodeTaints]
    keys: frozenset[str] = frozenset(DEFAULT_TAINTS)
    lead: timedelta = timedelta(minutes=2)
    interval: float = 2.0
    clock: Clock = wall_clock
    settings: WatchSettings | None = None
    name: str = "kubernetes"

    async def watch(self, sink: Sink) -> None:
        channel = "kubernetes/taints"

        def changed() -> None:
            sink.observed(channel, self.taints(mirror.items.values()))

        mirror = Mirror(
            "node", self.feed, key=lambda _: "node", changed=changed, settings=self.settings
        )
        await _follow_reporting(
            sink, channel, [mirror], lambda: self.taints(mirror.items.values()), self.interval
        )

    def taints(self, nodes: Iterable[NodeTaints]) -> list[Notice]:
        """The notices the configured taints among ``nodes``' (this node's) taints stand for."""
        now = self.clock()
        present = sorted({taint for taints in nodes for taint in taints})
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
            for key, value in present
            if key in self.keys
        ]

    def stale_after(self) -> float:
        return max(30.0, 10 * self.interval)

    async def acknowledge(self, notice: Notice) -> None:
        """Nothing to acknowledge: the platform removes the node when it is empty."""

    async def aclose(self) -> None:
        """Nothing to close."""


def _no_pod(_uid: PodUid) -> Pod | None:
    return None


@dataclass(slots=True)
class KubeEventProvider:
    """Pods warned by the platform with an Event of a configured reason (e.g. the pre-release
    event that ACK/ACS give BestEffort pods minutes before reclaiming them): each such pod on
    this node gets a notice scoped to it, ``lead`` after the warning was first seen, for as long
    as the Event exists. An Event's field selectors cannot name a node, so each reason is one
    watch of the Events of that reason about pods, and ``pod_of`` (the agent's pods, set once
    the agent is built) keeps those about this node's pods; a pod that arrives later is matched
    at the next report."""

    #: One feed per reason (see :meth:`nodeagent.adapters.k8s.Cluster.event_feed`).
    feeds: Sequence[Feed[PodEvent]]
    lead: timedelta = timedelta(minutes=5)
    interval: float = 2.0
    clock: Clock = wall_clock
    settings: WatchSettings | None = None
    name: str = "kubernetes"
    #: This node's pod with that uid, if it is one.
    pod_of: Callable[[PodUid], Pod | None] = _no_pod

    async def watch(self, sink: Sink) -> None:
        channel = "kubernetes/pod-events"

        def changed() -> None:
            sink.observed(channel, self.pods(mirrors))

        mirrors = [
            Mirror("events", feed, key=lambda e: e.uid, changed=changed, settings=self.settings)
            for feed in self.feeds
        ]
        await _follow_reporting(sink, channel, mirrors, lambda: self.pods(mirrors), self.interval)

    def pods(self, mirrors: Sequence[Mirror[PodEvent]]) -> list[Notice]:
        now = self.clock()
        notices: dict[EventId, Notice] = {}
        events = sorted((e for m in mirrors for e in m.items.values()), key=lambda e: e.uid)
        for event in events:
            pod = self.pod_of(event.pod)
            event_id = EventId(f"kube-event-{event.pod}")
            if pod is None or event_id in notices:
                continue
            notices[event_id] = Notice(
                event_id=event_id,
                source=self.name,
                channel="kubernetes/pod-events",
                kind=Kind.PREEMPT,
                deadline=now + self.lead,
                reason=f"platform warning on {pod.key}: event {event.reason}: {event.message}",
                scope=frozenset({pod.key}),
            )
        return list(notices.values())

    def stale_after(self) -> float:
        return max(30.0, 10 * self.interval)

    async def acknowledge(self, notice: Notice) -> None:
        """Nothing to acknowledge."""

    async def aclose(self) -> None:
        """Nothing to close."""


def _no_pods() -> tuple[Pod, ...]:
    return ()


@dataclass(slots=True)
class KubePodProvider:
    """Pods warned by the platform with a configured pod condition: each such pod gets a notice
    scoped to it, ``lead`` after the warning was first seen. The pods come from the agent's
    pod watch, which marks each pod carrying such a condition (its ``warning``); ``pods``
    (the agent's, set once the agent is built) is read every ``interval``, with no request."""

    lead: timedelta = timedelta(minutes=5)
    interval: float = 2.0
    clock: Clock = wall_clock
    rng: random.Random = field(default_factory=random.Random)
    name: str = "kubernetes"
    #: This node's pods as the agent follows them.
    pods: Callable[[], Iterable[Pod]] = _no_pods

    async def watch(self, sink: Sink) -> None:
        settings = HttpSettings("", interval=self.interval)

        async def tick() -> None:
            await report(sink, "kubernetes/pods", self.warned)

        await poll_forever(settings, self.rng, tick)

    async def warned(self) -> Sequence[Notice]:
        now = self.clock()
        return [
            Notice(
                event_id=EventId(f"kube-pod-{pod.uid}"),
                source=self.name,
                channel="kubernetes/pods",
                kind=Kind.PREEMPT,
                deadline=now + self.lead,
                reason=f"platform warning on {pod.key}: {pod.warning}",
                scope=frozenset({pod.key}),
            )
            for pod in sorted(self.pods(), key=lambda p: p.uid)
            if pod.warning is not None
        ]

    def stale_after(self) -> float:
        return max(30.0, 10 * self.interval)

    async def acknowledge(self, notice: Notice) -> None:
        """Nothing to acknowledge."""

    async def aclose(self) -> None:
        """Nothing to close."""
