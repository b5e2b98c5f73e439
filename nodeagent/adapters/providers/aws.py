"""AWS EC2 instance metadata: spot interruption, rebalance recommendation, scheduled events.

Three channels, read concurrently on every tick (IMDSv2 session token, IMDSv1 fallback):

- ``aws/spot``: ``spot/instance-action`` (404 = nothing planned). No id of its own, and an
  instance is interrupted once: the id is the action, so the same notice read again is the same
  notice even when its time moves (the store keeps the earliest deadline).
- ``aws/rebalance``: ``events/recommendations/rebalance``, one at a time, so one id. Not
  disruptive: the node is only tainted so nothing new lands there (draining on it makes nodes
  thrash).
- ``aws/maintenance``: ``events/maintenance/scheduled``; ``active`` events are notices, a
  ``canceled`` or ``completed`` one is a withdrawal.
- ``aws/lifecycle``: ``autoscaling/target-lifecycle-state`` (404 outside an Auto Scaling
  group). ``Terminated`` or ``Warmed:Terminated`` is a notice with ``lifecycle_lead`` to go: the
  group's termination lifecycle hook holds the instance that long (its heartbeat timeout, an
  hour unless the hook says otherwise). The state has no time of its own; the deadline is taken
  from the first read (the store keeps the earliest), and a state back to ``InService`` withdraws
  it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from nodeagent.adapters.providers.base import (
    BadBody,
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
    http_date_field,
    json_body,
    rfc3339_field,
    unexpected,
)
from nodeagent.core.events import EventId, Kind, Notice
from nodeagent.core.ports import Sink

DEFAULT_URL = "http://169.254.169.254"
SPOT_LEAD = timedelta(minutes=2)
#: A spot time later than this is not believed (the documented notice is two minutes).
SPOT_MAX_LEAD = timedelta(minutes=5)
_ACTIONS = {"terminate": Kind.TERMINATE, "stop": Kind.STOP, "hibernate": Kind.HIBERNATE}
#: Lifecycle hook heartbeat timeout when the hook does not set one.
LIFECYCLE_LEAD = timedelta(hours=1)
#: The target lifecycle states Auto Scaling documents; anything else is a garbled answer.
_LIFECYCLE_STATES = frozenset(
    {
        "Pending",
        "InService",
        "Terminated",
        "Detached",
        "Standby",
        "Warmed:Hibernated",
        "Warmed:Running",
        "Warmed:Stopped",
        "Warmed:Terminated",
    }
)
_LIFECYCLE_LEAVING = frozenset({"Terminated", "Warmed:Terminated"})
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
    lifecycle_lead: timedelta = LIFECYCLE_LEAD
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
                report(sink, "aws/lifecycle", self.lifecycle),
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
                # One interruption per instance: its identity is the action, not the body (a
                # time that moves between reads is the same notice; the store keeps the
                # earliest deadline it was given).
                event_id=EventId(f"aws-spot-{action}"),
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
                # At most one recommendation stands at a time; a noticeTime re-stamped on each
                # read is still that one.
                event_id=EventId("aws-rebalance"),
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

    async def lifecycle(self) -> Sequence[Notice]:
        where = "autoscaling/target-lifecycle-state"
        resp = await self.token.get("/latest/meta-data/" + where)
        if resp.status == 404:
            return []
        if resp.status != 200:
            raise unexpected(resp, where)
        state = resp.body.strip()
        if state not in _LIFECYCLE_STATES:
            raise BadBody(f"{where}: not a lifecycle state: {resp.body[:80]!r}")
        if state not in _LIFECYCLE_LEAVING:
            return []
        return [
            Notice(
                event_id=EventId("aws-lifecycle-terminated"),
                source=self.name,
                channel="aws/lifecycle",
                kind=Kind.TERMINATE,
                deadline=self.clock() + self.lifecycle_lead,
                reason=f"EC2 Auto Scaling is taking the instance out: target state {state}",
            )
        ]

    def stale_after(self) -> float:
        return max(10.0, 10 * self.settings.interval)

    async def acknowledge(self, notice: Notice) -> None:
        """EC2 has no acknowledgement: the instance goes at the stated time."""

    async def aclose(self) -> None:
        await self.http.aclose()
