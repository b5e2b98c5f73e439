"""A revocation notice put into one node's fake metadata server, for each cloud the agent knows.

The servers follow each cloud's documented protocol (``nodeagent.testing.metadata``); the demo
only sets what the cloud would publish. Leads are the documented ones divided by the demo's time
compression, except GCP's, whose preemption notice carries no time (the agent assumes 30 s).
"""

from __future__ import annotations

import datetime as dt
from email.utils import format_datetime
from typing import Any

from nodeagent.testing import metadata

LEADS = {"aws": 120.0, "gcp": 30.0, "azure": 30.0, "alibaba": 300.0}


def _rfc3339(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class CloudNode:
    """The metadata server of one node of the chosen cloud."""

    def __init__(self, cloud: str, servers: metadata.Threaded, node: str) -> None:
        if cloud not in LEADS:
            raise ValueError(f"unknown cloud {cloud!r}; choose from {sorted(LEADS)}")
        self.cloud = cloud
        self.node = node
        self.servers = servers
        self.server: Any
        if cloud == "aws":
            self.server = servers.start(metadata.AwsMetadata(v2_only=True))
        elif cloud == "gcp":
            self.server = servers.start(metadata.GcpMetadata())
        elif cloud == "azure":
            self.server = servers.start(metadata.AzureMetadata(vm_name=node))
        else:
            self.server = servers.start(metadata.AlibabaMetadata())

    @property
    def url(self) -> str:
        return str(self.server.url)

    def lead(self, compression: float) -> float:
        return LEADS[self.cloud] if self.cloud == "gcp" else LEADS[self.cloud] / compression

    def post(self, compression: float) -> float:
        """Publish a revocation; returns its lead in seconds."""
        lead = self.lead(compression)
        when = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=lead)
        if self.cloud == "aws":
            action = {"action": "terminate", "time": _rfc3339(when)}
            self.servers.call(lambda: setattr(self.server, "instance_action", action))
        elif self.cloud == "gcp":
            self.servers.call(lambda: self.server.set("instance/preempted", "TRUE"))
        elif self.cloud == "azure":
            event = {
                "EventId": f"demo-{self.node}",
                "EventType": "Preempt",
                "ResourceType": "VirtualMachine",
                "Resources": [self.node],
                "EventStatus": "Scheduled",
                "NotBefore": format_datetime(when, usegmt=True),
                "Description": "Spot eviction",
                "EventSource": "Platform",
                "DurationInSeconds": -1,
            }
            self.servers.call(lambda: self.server.set_events([event]))
        else:
            self.servers.call(lambda: setattr(self.server, "termination_time", _rfc3339(when)))
        return lead
