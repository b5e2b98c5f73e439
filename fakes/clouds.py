"""A revocation notice put into (and taken out of) each cloud's fake metadata server.

Shared by the agent's integration tests, its latency benchmark and the demo. Each class sets
only what that cloud publishes; the servers themselves are in :mod:`fakes.metadata`.
AWS and Alibaba carry the deadline in the notice (``renew`` moves it); Azure's ``NotBefore`` is
``lead`` from the moment of posting; GCP's preemption notice carries no time at all.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

from fakes import metadata


class Cloud:
    """Puts a notice with a deadline ``lead`` from now into a fake metadata server."""

    name: str
    #: The notice's lead time on this cloud (the agent caps leads at what the cloud documents).
    lead: timedelta
    server: Any

    def __init__(self, servers: metadata.Threaded) -> None:
        self.servers = servers
        self.time = ""

    @property
    def url(self) -> str:
        return str(self.server.url)

    def post(self) -> None:
        raise NotImplementedError

    def withdraw(self) -> None:
        raise NotImplementedError

    def acknowledged(self) -> bool:
        return True

    def renew(self, lead: timedelta | None = None) -> None:
        """Take ``lead`` (default: the cloud's own) from now for the next notice."""
        if lead is not None:
            self.lead = lead
        self.time = _rfc3339(datetime.now(UTC) + self.lead)


def _rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class Aws(Cloud):
    name = "aws"
    lead = timedelta(minutes=2)

    def __init__(self, servers: metadata.Threaded) -> None:
        super().__init__(servers)
        self.server = servers.start(metadata.AwsMetadata(v2_only=True))
        self.renew()

    def post(self) -> None:
        action = {"action": "terminate", "time": self.time}
        self.servers.call(lambda: setattr(self.server, "instance_action", action))

    def withdraw(self) -> None:
        self.servers.call(lambda: setattr(self.server, "instance_action", None))


class Gcp(Cloud):
    name = "gcp"
    lead = timedelta(seconds=30)

    def __init__(self, servers: metadata.Threaded) -> None:
        super().__init__(servers)
        self.server = servers.start(metadata.GcpMetadata())

    def post(self) -> None:
        self.servers.call(lambda: self.server.set("instance/preempted", "TRUE"))

    def withdraw(self) -> None:
        self.servers.call(lambda: self.server.set("instance/preempted", "FALSE"))


class Azure(Cloud):
    name = "azure"
    lead = timedelta(seconds=30)

    def __init__(self, servers: metadata.Threaded, vm_name: str = "vm-itest") -> None:
        super().__init__(servers)
        self.vm_name = vm_name
        self.server = servers.start(metadata.AzureMetadata(vm_name=vm_name))
        self.event_id = "602d9444-d2cd-49c7-8624-8643e7171297"

    def post(self) -> None:
        event = {
            "EventId": self.event_id,
            "EventType": "Preempt",
            "ResourceType": "VirtualMachine",
            "Resources": [self.vm_name],
            "EventStatus": "Scheduled",
            "NotBefore": format_datetime(datetime.now(UTC) + self.lead, usegmt=True),
            "Description": "Spot eviction",
            "EventSource": "Platform",
            "DurationInSeconds": -1,
        }
        self.servers.call(lambda: self.server.set_events([event]))

    def withdraw(self) -> None:
        self.servers.call(lambda: self.server.set_events([]))

    def acknowledged(self) -> bool:
        return self.servers.call(lambda: self.event_id in self.server.approved)


class Alibaba(Cloud):
    name = "alibaba"
    lead = timedelta(minutes=5)

    def __init__(self, servers: metadata.Threaded) -> None:
        super().__init__(servers)
        self.server = servers.start(metadata.AlibabaMetadata())
        self.renew()

    def post(self) -> None:
        self.servers.call(lambda: setattr(self.server, "termination_time", self.time))

    def withdraw(self) -> None:
        self.servers.call(lambda: setattr(self.server, "termination_time", None))


class NoCloud(Cloud):
    """``--provider none``: no metadata server at all."""

    name = "none"
    lead = timedelta(0)

    @property
    def url(self) -> str:
        return "http://127.0.0.1:9"


CLOUDS: dict[str, type[Cloud]] = {"aws": Aws, "gcp": Gcp, "azure": Azure, "alibaba": Alibaba}
