"""Drain detection: says once per notice when the node it governs has drained.

After each reconcile turn the store is asked whether the governing notice (the most urgent
node-wide one) has drained (:meth:`nodeagent.core.store.Store.newly_drained`): once every pod it
concerns is out, the node has drained. That is logged, timed from the notice's detection (which
the store keeps), and sent to the webhook, once per event id while the notice is live (the store
remembers which, and lets go with the notice)::

    draining --every pod out--> drained (final for that event id)
"""

from __future__ import annotations

import time

import structlog

from nodeagent.adapters.metrics import Metrics
from nodeagent.adapters.webhook import Webhook, payload
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
        webhook: Webhook | None = None,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._node_name = node_name
        self._webhook = webhook

    def check(self) -> None:
        governing = self._store.newly_drained()
        if governing is None:
            return
        detected = self._store.detected_at(governing.event_id)
        if detected is not None:
            self._metrics.drain.observe(time.monotonic() - detected)
        log.warning("node_drained", event_id=governing.event_id)
        if self._webhook is not None:
            self._webhook.send(payload("drained", self._node_name, governing))
