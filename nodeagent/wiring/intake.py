"""What the providers report, into the store.

Each provider reports complete observations of its channels, or a failed read (see
:mod:`nodeagent.adapters.providers`); the GPU monitor reports its fault notices as the channel
``gpu``.
An observation updates the channel's read health (:mod:`nodeagent.wiring.channels`) and goes to the
store, which deduplicates by event id and notices withdrawals. The scheduler's reclaims come from
the pods room (:meth:`Intake.reclaims`, the channel ``scheduler/reclaim``), read from this node's
pods rather than from a metadata channel. Each notice new to the store is
detected: the store keeps its time (the time to notify and to drain are measured from it), it is
counted and logged, and a disruptive one goes to the webhook. A change of the live notices wakes the
reconcile loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import datetime

import structlog

from nodeagent.adapters.metrics import Metrics
from nodeagent.adapters.webhook import Webhook, payload
from nodeagent.core.events import RECLAIM_CHANNEL, Notice, rfc3339
from nodeagent.core.ports import Provider, ProviderError, Reader, Sink
from nodeagent.core.store import Store
from nodeagent.wiring.channels import Channels

log = structlog.get_logger("nodeagent")


class _ProviderSink:
    """Reports of one provider, tagged with it (which channel is whose, how stale is too old)."""

    def __init__(self, intake: Intake, provider: Provider) -> None:
        self._intake = intake
        self._provider = provider

    def observed(self, channel: str, notices: Sequence[Notice]) -> None:
        self._intake.observed(channel, notices, self._provider)

    def failed(self, channel: str, error: ProviderError) -> None:
        self._intake.failed(channel, error, self._provider)


class Intake:
    """The sink of every provider (:meth:`sink`) and of the GPU monitor (:meth:`observed`)."""

    def __init__(
        self,
        store: Store,
        channels: Channels,
        metrics: Metrics,
        *,
        node_name: str,
        clock: Callable[[], datetime],
        wake: Callable[[], None],
        webhook: Webhook | None = None,
    ) -> None:
        self._store = store
        self._channels = channels
        self._metrics = metrics
        self._node_name = node_name
        self._clock = clock
        self._wake = wake
        self._webhook = webhook

    def sink(self, provider: Provider) -> Sink:
        return _ProviderSink(self, provider)

    def observed(
        self, channel: str, notices: Sequence[Notice], reader: Reader | None = None
    ) -> None:
        """A complete observation of ``channel``: ``notices`` are all it holds now."""
        self._channels.read(channel, reader, now=time.monotonic(), wall=self._clock())
        self._take(channel, notices)

    def reclaims(self, notices: Sequence[Notice]) -> None:
        """Every reclaim the scheduler has written on this node's pods now (a complete set, from
        the pods as last listed or watched)."""
        self._take(RECLAIM_CHANNEL, notices)

    def _take(self, channel: str, notices: Sequence[Notice]) -> None:
        before = {t.notice.event_id for t in self._store.active()}
        new = self._store.observe(channel, notices, self._clock(), detected=time.monotonic())
        live = {t.notice.event_id: t.notice for t in self._store.active()}
        for event_id in new:
            self._detect(live[event_id])
        for event_id in before - live.keys():
            self._metrics.withdrawn.inc()
            log.warning("notice_withdrawn", event_id=event_id, channel=channel)
        self._metrics.active.set(len(live))
        if before != set(live) or new:
            self._wake()

    def failed(self, channel: str, error: ProviderError, reader: Reader | None = None) -> None:
        self._channels.failed(channel, reader, kind=error.kind, error=str(error))

    def _detect(self, notice: Notice) -> None:
        self._metrics.notices.labels(notice.source, notice.kind.value).inc()
        lead = (notice.deadline - self._clock()).total_seconds()
        self._metrics.lead.observe(max(0.0, lead))
        if self._webhook is not None and notice.disruptive:
            self._webhook.send(payload("notice", self._node_name, notice))
        log.warning(
            "notice_detected",
            event_id=notice.event_id,
            source=notice.source,
            kind=notice.kind.value,
            deadline=rfc3339(notice.deadline),
            disruptive=notice.disruptive,
            reason=notice.reason,
        )
