"""Drain detection: says once per notice when the node it governs has drained.

After each reconcile turn the governing notice (the most urgent node-wide one) is checked: once
every pod it concerns is out, the node has drained. That is logged, timed from the notice's
detection, and sent to the webhook, once per event id::

    draining --every pod out--> drained (final for that event id)
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from nodeagent.adapters.metrics import Metrics
from nodeagent.adapters.webhook import Webhook, payload
from nodeagent.core.events import EventId
from nodeagent.core.store import Store

log = structlog.get_logger("nodeagent")


class DrainWatch:
    """Checked after each reconcile turn (:meth:`check`)."""

    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        *,
        node_name: str,
        detected_at: Callable[[EventId], float | None],
        webhook: Webhook | None = None,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._node_name = node_name
        self._detected_at = detected_at
        self._webhook = webhook
        self._drained: set[EventId] = set()

    def check(self) -> None:
        governing = self._store.governing()
        if governing is None or governing.event_id in self._drained:
            return
        if not self._store.pods_out():
            return
        self._drained.add(governing.event_id)
        detected = self._detected_at(governing.event_id)
        if detected is not None:
            self._metrics.drain.observe(time.monotonic() - detected)
        log.warning("node_drained", event_id=governing.event_id)
        if self._webhook is not None:
            self._webhook.send(payload("drained", self._node_name, governing))
