"""Alibaba Cloud ECS metadata: spot instance reclaim (``instance/spot/termination-time``).

404 means nothing is planned; otherwise the body is the UTC time of the reclaim, about five
minutes ahead. Hardened mode (a session token as with IMDSv2) is used when the server offers it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from nodeagent.adapters.providers.base import (
    Clock,
    Http,
    HttpSettings,
    bounded,
    poll_forever,
    report,
    wall_clock,
)
from nodeagent.adapters.providers.common import (
    SessionToken,
    digest,
    plain_body,
    rfc3339_field,
    unexpected,
)
from nodeagent.core.events import EventId, Kind, Notice
from nodeagent.core.ports import Sink

DEFAULT_URL = "http://100.100.100.200"
WHERE = "instance/spot/termination-time"
#: A reclaim time later than this is not believed (the documented notice is five minutes).
MAX_LEAD = timedelta(minutes=10)


@dataclass(slots=True)
class AlibabaProvider:
    settings: HttpSettings = field(default_factory=lambda: HttpSettings(DEFAULT_URL))
    token_ttl: int = 21600
    clock: Clock = wall_clock
    rng: random.Random = field(default_factory=random.Random)
    name: str = "alibaba"
    http: Http = field(init=False)
    token: SessionToken = field(init=False)

    def __post_init__(self) -> None:
        self.http = Http(self.settings)
        self.token = SessionToken(
            self.http,
            "/latest/api/token",
            "X-aliyun-ecs-metadata-token-ttl-seconds",
            "X-aliyun-ecs-metadata-token",
            ttl=self.token_ttl,
        )

    async def watch(self, sink: Sink) -> None:
        async def tick() -> None:
            await report(sink, "alibaba/spot", self.termination)

        await poll_forever(self.settings, self.rng, tick)

    async def termination(self) -> Sequence[Notice]:
        resp = await self.token.get("/latest/meta-data/" + WHERE)
        if resp.status == 404:
            return []
        if resp.status != 200:
            raise unexpected(resp, WHERE)
        text = plain_body(resp, WHERE)
        stated = rfc3339_field(text, WHERE)
        return [
            Notice(
                event_id=EventId(f"alibaba-spot-{digest(text)}"),
                source=self.name,
                channel="alibaba/spot",
                kind=Kind.TERMINATE,
                deadline=bounded(stated, self.clock(), MAX_LEAD, source=self.name),
                reason="ECS spot instance reclaim",
            )
        ]

    def stale_after(self) -> float:
        return max(10.0, 10 * self.settings.interval)

    async def acknowledge(self, notice: Notice) -> None:
        """ECS has no acknowledgement."""

    async def aclose(self) -> None:
        await self.http.aclose()
