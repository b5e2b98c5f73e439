"""The body of a Kubernetes Event (``core/v1``) as both programs write them.

Pure: the caller sends it with its own client. Messages are cut to 1,024 characters, as the
API server's validation requires.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contracts.times import format_time

MAX_MESSAGE = 1024


@dataclass(frozen=True, slots=True)
class EventSource:
    """Who reports: the program (``component``), which instance of it, and on which node."""

    component: str
    instance: str
    host: str | None = None


def event_body(
    involved: Mapping[str, str],
    kind: str,
    reason: str,
    message: str,
    *,
    by: EventSource,
    now: float,
) -> dict[str, Any]:
    """A ``kind`` (Normal, Warning) Event about ``involved`` (apiVersion, kind, name, namespace,
    and uid when known: ``kubectl describe`` matches Events to an object by its uid)."""
    namespace = involved.get("namespace") or "default"
    stamp = format_time(now)
    source: dict[str, str] = {"component": by.component}
    if by.host:
        source["host"] = by.host
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
        "involvedObject": {**involved, "namespace": namespace},
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "type": kind,
        "source": source,
        "reportingComponent": by.component,
        "reportingInstance": by.instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
