"""AWS EC2 instance metadata: spot interruption, rebalance recommendation, scheduled events.

Three channels, read concurrently on every tick (IMDSv2 session token, IMDSv1 fallback):

- ``aws/spot``: ``spot/instance-action`` (404 = nothing planned). No id of its own: the id is a
  digest of action and time, so the same notice read again is the same notice.
- ``aws/rebalance``: ``events/recommendations/rebalance``. Not disruptive: the node is only
  tainted so nothing new lands there (draining on it makes nodes thrash).
- ``aws/maintenance``: ``events/maintenance/scheduled``; ``active`` events are notices, a
  ``canceled`` or ``completed`` one is a withdrawal.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from nodeagent.events import EventId, Kind, Notice
from nodeagent.providers.base import (
    BadBody,
    Clock,
    Http,
    HttpSettings,
    Sink,
    bounded,
    poll_forever,
    report,
    wall_clock,
)
from nodeagent.providers.common import (
    SessionToken,
    digest,
    http_date_field,
    json_body,
    rfc3339_field,
    unexpected,
)

DEFAULT_URL = "http://169.254.169.254"
SPOT_LEAD = timedelta(minutes=2)
#: A spot time later than this is not believed (the documented notice is two minutes).
SPOT_MAX_LEAD = timedelta(minutes=5)
_ACTIONS = {"terminate": Kind.TERMINATE, "stop": Kind.STOP, "hibernate": Kind.HIBERNATE}
_MAINTENANCE = {
    "instance-reboot": (Kind.REBOOT, True),
    "system-reboot": (Kind.REBOOT, True),
    "instance-retirement": (Kind.TERMINATE, True),
    "instance-stop": (Kind.STOP, True),
    "system-maintenance": (Kind.MAINTENANCE, False),
}


@dataclass(slots=True)
class AwsProvider:
    settings: HttpSettings = field(default_factory=lambda: HttpSettings(DEFAULT_URL))
    token_ttl: int = 21600
    clock: Clock = wall_clock
    rng: random.Random = field(default_factory=random.Random)
    name: str = "aws"
    http: Http = field(init=False)
    token: SessionToken = field(init=False)

    def __post_init__(self) -> None:
        self.http = Http(self.settings)
        self.token = SessionToken(
            self.http,
            "/latest/api/token",
            "X-aws-ec2-metadata-token-ttl-seconds",
            "X-aws-ec2-metadata-token",
            ttl=self.token_ttl,
        )

    async def watch(self, sink: Sink) -> None:
        async def tick() -> None:
            await asyncio.gather(
                report(sink, "aws/spot", self.spot),
                report(sink, "aws/rebalance", self.rebalance),
                report(sink, "aws/maintenance", self.maintenance),
            )

        await poll_forever(self.settings, self.rng, tick)

    async def spot(self) -> Sequence[Notice]:
        where = "spot/instance-action"
        resp = await self.token.get("/latest/meta-data/" + where)
        if resp.status == 404:
            return []
        if resp.status != 200:
            raise unexpected(resp, where)
        doc = json_body(resp, where)
        action = doc.get("action") if isinstance(doc, dict) else None
        if not isinstance(action, str) or action not in _ACTIONS:
            raise BadBody(f"{where}: expected {{action, time}}, got {resp.body[:80]!r}")
        stated = rfc3339_field(doc.get("time"), f"{where}.time")
        return [
            Notice(
                event_id=EventId(f"aws-spot-{digest(action, resp.body.strip())}"),
                source=self.name,
                channel="aws/spot",
                kind=_ACTIONS[action],
                deadline=bounded(stated, self.clock(), SPOT_MAX_LEAD, source=self.name),
                reason=f"EC2 spot interruption: {action}",
            )
        ]

    async def rebalance(self) -> Sequence[Notice]:
        where = "events/recommendations/rebalance"
        resp = await self.token.get("/latest/meta-data/" + where)
        if resp.status == 404:
            return []
        if resp.status != 200:
            raise unexpected(resp, where)
        doc = json_body(resp, where)
        if not isinstance(doc, dict):
            raise BadBody(f"{where}: expected {{noticeTime}}, got {resp.body[:80]!r}")
        noticed = rfc3339_field(doc.get("noticeTime"), f"{where}.noticeTime")
        return [
            Notice(
                event_id=EventId(f"aws-rebalance-{digest(resp.body.strip())}"),
                source=self.name,
                channel="aws/rebalance",
                kind=Kind.REBALANCE,
                # No deadline is promised; an interruption could follow with the usual 2 min.
                deadline=noticed + SPOT_LEAD,
                reason="EC2 rebalance recommendation: elevated risk of interruption",
                disruptive=False,
            )
        ]

    async def maintenance(self) -> Sequence[Notice]:
        where = "events/maintenance/scheduled"
        resp = await self.token.get("/latest/meta-data/" + where)
        if resp.status == 404:
            return []
        if resp.status != 200:
            raise unexpected(resp, where)
        doc = json_body(resp, where)
        if not isinstance(doc, list):
            raise BadBody(f"{where}: expected a list of events, got {resp.body[:80]!r}")
        notices: list[Notice] = []
        for i, event in enumerate(doc):
            at = f"{where}[{i}]"
            if not isinstance(event, dict):
                raise BadBody(f"{at}: expected an object")
            if event.get("State") != "active":
                continue
            code, event_id = event.get("Code"), event.get("EventId")
            if not isinstance(event_id, str) or not event_id:
                raise BadBody(f"{at}.EventId: expected a string")
            kind, disruptive = _MAINTENANCE.get(str(code), (Kind.MAINTENANCE, True))
            notices.append(
                Notice(
                    event_id=EventId(f"aws-{event_id}"),
                    source=self.name,
                    channel="aws/maintenance",
                    kind=kind,
                    deadline=http_date_field(event.get("NotBefore"), f"{at}.NotBefore"),
                    reason=f"EC2 scheduled event {code}: {event.get('Description', '')}".strip(),
                    disruptive=disruptive,
                )
            )
        return notices

    def stale_after(self) -> float:
        return max(10.0, 10 * self.settings.interval)

    async def acknowledge(self, notice: Notice) -> None:
        """EC2 has no acknowledgement: the instance goes at the stated time."""

    async def aclose(self) -> None:
        await self.http.aclose()
