"""Azure Scheduled Events (api-version 2020-07-01), acknowledged with ``StartRequests``.

Polled from boot every interval (the first call enables the service and may take up to two
minutes, so it gets a longer timeout). Events broadcast to a whole scale set are acted on only
when ``Resources`` names this VM (its name from ``--azure-vm-name`` or the instance metadata).
Freeze is a pause of seconds: the node is tainted but pods stay. An event that is already
``Started`` has no ``NotBefore``: its deadline is the moment it was first seen.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import structlog

from nodeagent.adapters.providers.base import (
    BadBody,
    Clock,
    Http,
    HttpSettings,
    poll_forever,
    report,
    wall_clock,
)
from nodeagent.adapters.providers.common import http_date_field, json_body, plain_body, unexpected
from nodeagent.core.events import EventId, Kind, Notice
from nodeagent.core.ports import ProviderError, Sink

log = structlog.get_logger("nodeagent.adapters.providers.azure")

DEFAULT_URL = "http://169.254.169.254"
PATH = "/metadata/scheduledevents"
API = {"api-version": "2020-07-01"}
HEADERS = {"Metadata": "true"}
_TYPES = {
    "Preempt": (Kind.PREEMPT, True),
    "Terminate": (Kind.TERMINATE, True),
    "Reboot": (Kind.REBOOT, True),
    "Redeploy": (Kind.REDEPLOY, True),
    "Freeze": (Kind.FREEZE, False),
}


@dataclass(slots=True)
class AzureProvider:
    settings: HttpSettings = field(default_factory=lambda: HttpSettings(DEFAULT_URL))
    vm_name: str | None = None
    first_timeout: float = 120.0
    clock: Clock = wall_clock
    rng: random.Random = field(default_factory=random.Random)
    name: str = "azure"
    http: Http = field(init=False)
    _answered: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.http = Http(self.settings)

    async def watch(self, sink: Sink) -> None:
        async def tick() -> None:
            await report(sink, "azure", self.events)

        await poll_forever(self.settings, self.rng, tick)

    async def _vm_name(self) -> str | None:
        if self.vm_name is None:
            try:
                resp = await self.http.request(
                    "GET",
                    "/metadata/instance/compute/name",
                    headers=HEADERS,
                    params={"api-version": "2021-02-01", "format": "text"},
                )
            except ProviderError:
                return None
            if resp.status == 200 and resp.body.strip():
                self.vm_name = plain_body(resp, "compute/name")
        return self.vm_name

    async def events(self) -> Sequence[Notice]:
        timeout = None if self._answered else self.first_timeout
        resp = await self.http.request("GET", PATH, headers=HEADERS, params=API, time_limit=timeout)
        if resp.status != 200:
            raise unexpected(resp, "scheduledevents")
        self._answered = True
        doc = json_body(resp, "scheduledevents")
        if not isinstance(doc, dict) or not isinstance(doc.get("Events"), list):
            raise BadBody(f"scheduledevents: expected {{Events: [...]}}, got {resp.body[:80]!r}")
        me = await self._vm_name()
        now = self.clock()
        notices: list[Notice] = []
        for i, event in enumerate(doc["Events"]):
            at = f"scheduledevents.Events[{i}]"
            if not isinstance(event, dict):
                raise BadBody(f"{at}: expected an object")
            event_id, event_type = event.get("EventId"), event.get("EventType")
            if not isinstance(event_id, str) or not event_id:
                raise BadBody(f"{at}.EventId: expected a string")
            if not isinstance(event_type, str) or event_type not in _TYPES:
                raise BadBody(f"{at}.EventType: unknown {event_type!r}")
            resources = event.get("Resources") or []
            if not isinstance(resources, list):
                raise BadBody(f"{at}.Resources: expected a list")
            if me is not None and resources and me not in resources:
                continue
            not_before = event.get("NotBefore") or ""
            deadline = now if not not_before else http_date_field(not_before, f"{at}.NotBefore")
            kind, disruptive = _TYPES[event_type]
            notices.append(
                Notice(
                    event_id=EventId(f"azure-{event_id}"),
                    source=self.name,
                    channel="azure",
                    kind=kind,
                    deadline=deadline,
                    reason=f"Azure scheduled event {event_type} ({event.get('EventStatus', '')})"
                    + (f": {event['Description']}" if event.get("Description") else ""),
                    disruptive=disruptive,
                    upstream_id=event_id,
                )
            )
        return notices

    def stale_after(self) -> float:
        return max(10.0, 10 * self.settings.interval)

    async def acknowledge(self, notice: Notice) -> None:
        if notice.upstream_id is None:
            return
        body = json.dumps({"StartRequests": [{"EventId": notice.upstream_id}]})
        resp = await self.http.request(
            "POST",
            PATH,
            headers={**HEADERS, "Content-Type": "application/json"},
            params=API,
            data=body,
        )
        if resp.status != 200:
            raise unexpected(resp, "scheduledevents StartRequests")
        log.info("upstream_acknowledged", event_id=notice.event_id, source=self.name)

    async def aclose(self) -> None:
        await self.http.aclose()
