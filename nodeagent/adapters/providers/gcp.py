"""Google Compute Engine metadata: preemption and host maintenance, by long-poll.

Each of the two values is followed with ``?wait_for_change=true&last_etag=...``: the server
answers as soon as the value changes, so a preemption is seen at once rather than at the next
poll. A failed read (GCE answers 503 briefly during maintenance) is reported, then the value is
read afresh after the poll interval. Requests and answers carry ``Metadata-Flavor: Google``; an
answer without it did not come from the metadata server.

- ``gcp/preempted``: ``instance/preempted`` ``TRUE`` -> a notice (id ``gcp-preempted``) whose
  deadline is 30 s after it was first seen (the soft-off to hard-stop window).
- ``gcp/maintenance``: ``instance/maintenance-event``; ``TERMINATE_ON_HOST_MAINTENANCE`` is
  disruptive (60 s), ``MIGRATE_ON_HOST_MAINTENANCE`` only keeps new pods away.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from nodeagent.adapters.providers.base import (
    BadBody,
    Clock,
    Http,
    HttpSettings,
    next_wait,
    report,
    wall_clock,
)
from nodeagent.adapters.providers.common import plain_body, unexpected
from nodeagent.core.events import EventId, Kind, Notice
from nodeagent.core.ports import Sink

PATH = "/computeMetadata/v1"
DEFAULT_URL = "http://metadata.google.internal" + PATH
FLAVOR = {"Metadata-Flavor": "Google"}
PREEMPT_LEAD = timedelta(seconds=30)
MAINTENANCE_LEAD = timedelta(seconds=60)

Parse = Callable[[str, datetime], Sequence[Notice]]


@dataclass(slots=True)
class GcpProvider:
    settings: HttpSettings = field(default_factory=lambda: HttpSettings(DEFAULT_URL))
    #: How long the server may hold a long-poll open (``timeout_sec``).
    wait_seconds: int = 60
    clock: Clock = wall_clock
    rng: random.Random = field(default_factory=random.Random)
    name: str = "gcp"
    http: Http = field(init=False)

    def __post_init__(self) -> None:
        self.http = Http(self.settings)

    async def watch(self, sink: Sink) -> None:
        await asyncio.gather(
            self._follow(sink, "gcp/preempted", "/instance/preempted", self._preempted),
            self._follow(sink, "gcp/maintenance", "/instance/maintenance-event", self._maintenance),
        )

    async def _follow(self, sink: Sink, channel: str, path: str, parse: Parse) -> None:
        etag: str | None = None

        async def read() -> Sequence[Notice]:
            nonlocal etag
            params: dict[str, str] = {}
            timeout = self.settings.timeout
            if etag is not None:
                params = {
                    "wait_for_change": "true",
                    "last_etag": etag,
                    "timeout_sec": str(self.wait_seconds),
                }
                timeout += self.wait_seconds
            resp = await self.http.request(
                "GET", path, headers=FLAVOR, params=params, time_limit=timeout
            )
            if resp.status != 200:
                raise unexpected(resp, path)
            if resp.headers.get("Metadata-Flavor") != "Google":
                raise BadBody(f"{path}: answer without Metadata-Flavor: Google")
            notices = parse(plain_body(resp, path), self.clock())
            previous, etag = etag, resp.headers.get("ETag")
            if etag is not None and etag == previous:
                # Returned without a change (server timeout): pace the next call.
                await asyncio.sleep(next_wait(self.settings, self.rng))
            return notices

        while True:
            if not await report(sink, channel, read):
                etag = None
                await asyncio.sleep(next_wait(self.settings, self.rng))

    def _preempted(self, value: str, now: datetime) -> Sequence[Notice]:
        flag = value.upper()
        if flag == "FALSE":
            return []
        if flag != "TRUE":
            raise BadBody(f"instance/preempted: expected TRUE or FALSE, got {value[:40]!r}")
        return [
            Notice(
                event_id=EventId("gcp-preempted"),
                source=self.name,
                channel="gcp/preempted",
                kind=Kind.PREEMPT,
                deadline=now + PREEMPT_LEAD,
                reason="Compute Engine preempted this VM",
            )
        ]

    def _maintenance(self, value: str, now: datetime) -> Sequence[Notice]:
        if value == "NONE":
            return []
        if value == "TERMINATE_ON_HOST_MAINTENANCE":
            disruptive = True
        elif value == "MIGRATE_ON_HOST_MAINTENANCE":
            disruptive = False
        else:
            raise BadBody(f"instance/maintenance-event: unknown value {value[:40]!r}")
        return [
            Notice(
                event_id=EventId(f"gcp-{value.lower().replace('_', '-')}"),
                source=self.name,
                channel="gcp/maintenance",
                kind=Kind.MAINTENANCE,
                deadline=now + MAINTENANCE_LEAD,
                reason=f"Compute Engine host maintenance: {value}",
                disruptive=disruptive,
            )
        ]

    def stale_after(self) -> float:
        # A long-poll legitimately stays silent until the server's own timeout.
        return self.wait_seconds + self.settings.timeout + max(10.0, 10 * self.settings.interval)

    async def acknowledge(self, notice: Notice) -> None:
        """Compute Engine has no acknowledgement."""

    async def aclose(self) -> None:
        await self.http.aclose()
