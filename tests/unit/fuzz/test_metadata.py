"""Metadata documents come from a server the agent cannot vouch for (a proxy, a captive portal,
a broken host). Each provider's parser turns any answer into notices the store can plan with,
or into a ProviderError; nothing else."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.times import EARLIEST, LATEST
from nodeagent.adapters.providers.alibaba import AlibabaProvider
from nodeagent.adapters.providers.aws import AwsProvider
from nodeagent.adapters.providers.azure import AzureProvider
from nodeagent.adapters.providers.base import Response
from nodeagent.adapters.providers.gcp import GcpProvider
from nodeagent.core.events import Notice
from nodeagent.core.ports import ProviderError
from nodeagent.core.store import Store
from tests.unit.fuzz.cases import Cases, json_values, mutate, said, search, times

pytestmark = pytest.mark.reliability

NOW = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
CONTENT_TYPES = st.sampled_from(
    ["text/plain", "application/json", "text/html; charset=utf-8", "application/octet-stream", ""]
)


class Canned:
    """Stands in for the HTTP client and the session token: every read gets this answer."""

    def __init__(self, status: int, body: str, content_type: str) -> None:
        self.answer = Response(status=status, headers={"Content-Type": content_type}, body=body)

    async def get(self, path: str) -> Response:
        return self.answer

    async def request(self, method: str, path: str, **kwargs: Any) -> Response:
        return self.answer


def bodies(valid: object) -> st.SearchStrategy[str]:
    return st.one_of(
        mutate(valid).map(json.dumps),
        json_values.map(json.dumps),
        times,
        st.text(max_size=60),
    )


def plannable(notices: Sequence[Notice]) -> None:
    """What a provider returns can be planned with: deadlines in range, the store copes."""
    store = Store()
    for notice in notices:
        assert EARLIEST <= notice.deadline < LATEST
    for channel in {n.channel for n in notices}:
        store.observe(channel, [n for n in notices if n.channel == channel], NOW)
    store.due(NOW)


def outcome(read: Any) -> None:
    try:
        notices = asyncio.run(read())
    except ProviderError as exc:
        said(exc)
        return
    plannable(notices)


AWS_DOCS: Mapping[str, object] = {
    "spot": {"action": "terminate", "time": "2026-11-30T10:02:00Z"},
    "rebalance": {"noticeTime": "2026-11-30T10:00:00Z"},
    "maintenance": [
        {
            "Code": "system-reboot",
            "Description": "scheduled reboot",
            "EventId": "instance-event-0d59937288b749b32",
            "NotBefore": "21 Dec 2026 01:00:00 GMT",
            "NotAfter": "21 Dec 2026 07:00:00 GMT",
            "State": "active",
        }
    ],
}


@pytest.mark.parametrize("document", sorted(AWS_DOCS))
def test_aws_documents(document: str) -> None:
    cases = Cases(f"AWS {document} document")

    @search(400)
    @given(st.sampled_from([200, 200, 404, 500]), bodies(AWS_DOCS[document]), CONTENT_TYPES)
    def run(status: int, body: str, content_type: str) -> None:
        cases()
        provider = AwsProvider(clock=lambda: NOW)
        provider.token = Canned(status, body, content_type)  # type: ignore[assignment]
        outcome(getattr(provider, document))

    run()
    cases.record()


def test_gcp_values() -> None:
    cases = Cases("GCP metadata values")
    provider = GcpProvider(clock=lambda: NOW)
    known = [
        "TRUE",
        "FALSE",
        "NONE",
        "TERMINATE_ON_HOST_MAINTENANCE",
        "MIGRATE_ON_HOST_MAINTENANCE",
    ]

    @search(600)
    @given(st.sampled_from(["preempted", "maintenance"]), st.sampled_from(known) | st.text())
    def run(which: str, value: str) -> None:
        cases()
        parse = provider._preempted if which == "preempted" else provider._maintenance
        try:
            notices = parse(value, NOW)
        except ProviderError as exc:
            said(exc)
            return
        plannable(notices)

    run()
    cases.record()


AZURE_DOC = {
    "DocumentIncarnation": 3,
    "Events": [
        {
            "EventId": "A-1",
            "EventType": "Preempt",
            "ResourceType": "VirtualMachine",
            "Resources": ["vm-0"],
            "EventStatus": "Scheduled",
            "NotBefore": "Mon, 30 Nov 2026 10:00:30 GMT",
            "Description": "",
            "EventSource": "Platform",
            "DurationInSeconds": -1,
        }
    ],
}


def test_azure_scheduled_events() -> None:
    cases = Cases("Azure scheduled events document")

    @search(600)
    @given(st.sampled_from([200, 200, 400]), bodies(AZURE_DOC), CONTENT_TYPES)
    def run(status: int, body: str, content_type: str) -> None:
        cases()
        provider = AzureProvider(vm_name="vm-0", clock=lambda: NOW)
        provider.http = Canned(status, body, content_type)  # type: ignore[assignment]
        outcome(provider.events)

    run()
    cases.record()


def test_alibaba_termination_time() -> None:
    cases = Cases("Alibaba termination-time document")

    @search(400)
    @given(st.sampled_from([200, 200, 404, 403]), times | st.text(max_size=40), CONTENT_TYPES)
    def run(status: int, body: str, content_type: str) -> None:
        cases()
        provider = AlibabaProvider(clock=lambda: NOW)
        provider.token = Canned(status, body, content_type)  # type: ignore[assignment]
        outcome(provider.termination)

    run()
    cases.record()
