"""Each provider against a fake metadata server that speaks its cloud's documented protocol."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fakes.metadata import (
    AlibabaMetadata,
    AwsMetadata,
    AzureMetadata,
    GcpMetadata,
)
from nodeagent.adapters.providers import HttpSettings
from nodeagent.adapters.providers.alibaba import AlibabaProvider
from nodeagent.adapters.providers.aws import AwsProvider
from nodeagent.adapters.providers.azure import AzureProvider
from nodeagent.adapters.providers.base import BadBody, Http
from nodeagent.adapters.providers.common import SessionToken
from nodeagent.adapters.providers.gcp import GcpProvider
from nodeagent.core.events import Kind, Notice
from nodeagent.core.ports import ProviderError
from nodeagent.core.store import Settings as StoreSettings
from nodeagent.core.store import Store

NOW = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def fast(url: str, *, timeout: float = 0.5) -> HttpSettings:
    """Poll every 20 ms so the tests wait on events, not on the default 1 s interval."""
    return HttpSettings(url, interval=0.02, timeout=timeout)


class Recorder:
    """A sink that remembers every report and lets a test wait for a condition."""

    def __init__(self) -> None:
        self.observed_by: dict[str, list[Sequence[Notice]]] = {}
        self.failures: list[tuple[str, ProviderError]] = []
        self._changed = asyncio.Event()

    def observed(self, channel: str, notices: Sequence[Notice]) -> None:
        self.observed_by.setdefault(channel, []).append(list(notices))
        self._changed.set()

    def failed(self, channel: str, error: ProviderError) -> None:
        self.failures.append((channel, error))
        self._changed.set()

    def latest(self, channel: str) -> Sequence[Notice] | None:
        seen = self.observed_by.get(channel)
        return seen[-1] if seen else None

    def kinds(self) -> set[str]:
        return {error.kind for _, error in self.failures}

    async def until(self, condition: Callable[[], object], what: str) -> None:
        async def wait() -> None:
            while not condition():
                self._changed.clear()
                # Woken by a report, or re-checks shortly (conditions on the server's state).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), 0.05)

        try:
            await asyncio.wait_for(wait(), 10)
        except TimeoutError:
            pytest.fail(f"never happened: {what}")


async def watching(provider: Any, recorder: Recorder) -> asyncio.Task[None]:
    return asyncio.create_task(provider.watch(recorder))


@pytest.fixture
async def aws() -> AsyncIterator[AwsMetadata]:
    server = AwsMetadata()
    await server.start()
    yield server
    await server.close()


def aws_provider(server: AwsMetadata, **kwargs: float) -> AwsProvider:
    return AwsProvider(settings=fast(server.url, **kwargs), clock=lambda: NOW)


async def stop(task: asyncio.Task[None], provider: Any) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await provider.aclose()


# --- AWS ----------------------------------------------------------------------------------------


async def test_aws_spot_notice_is_read_with_a_token_and_keeps_its_id(aws: AwsMetadata) -> None:
    provider = aws_provider(aws)
    recorder = Recorder()
    task = await watching(provider, recorder)
    await recorder.until(lambda: recorder.latest("aws/spot") == [], "a first empty read")
    aws.instance_action = {"action": "terminate", "time": "2026-11-30T10:02:00Z"}
    await recorder.until(lambda: recorder.latest("aws/spot"), "the spot notice")
    await recorder.until(lambda: len(recorder.observed_by["aws/spot"]) >= 5, "more reads")
    await stop(task, provider)
    notices = [n for seen in recorder.observed_by["aws/spot"] for n in seen]
    assert {n.event_id for n in notices} == {notices[0].event_id}
    assert notices[0].kind is Kind.TERMINATE
    assert notices[0].deadline == datetime(2026, 11, 30, 10, 2, tzinfo=UTC)
    assert aws.token_puts == 1
    assert aws.unauthorized == 0
    assert recorder.failures == []


async def test_aws_auto_scaling_termination_is_a_notice_with_the_hooks_lead(
    aws: AwsMetadata,
) -> None:
    provider = AwsProvider(
        settings=fast(aws.url), clock=lambda: NOW, lifecycle_lead=timedelta(minutes=15)
    )
    recorder = Recorder()
    task = await watching(provider, recorder)
    # Outside an Auto Scaling group the item is a 404: no notice, no failure.
    await recorder.until(lambda: recorder.latest("aws/lifecycle") == [], "a first empty read")
    aws.lifecycle_state = "InService"
    await recorder.until(lambda: len(recorder.observed_by["aws/lifecycle"]) >= 3, "more reads")
    assert recorder.latest("aws/lifecycle") == []
    aws.lifecycle_state = "Terminated"
    await recorder.until(lambda: recorder.latest("aws/lifecycle"), "the lifecycle notice")
    (notice,) = recorder.latest("aws/lifecycle") or ()
    assert (notice.kind, notice.deadline) == (Kind.TERMINATE, NOW + timedelta(minutes=15))
    assert "Terminated" in notice.reason
    aws.lifecycle_state = "Warmed:Terminated"

    def warm_pool() -> Notice | None:
        latest = recorder.latest("aws/lifecycle") or ()
        return latest[0] if latest and "Warmed:Terminated" in latest[0].reason else None

    await recorder.until(warm_pool, "the warm pool's termination")
    assert (warm_pool() or notice).event_id == notice.event_id
    # Garbage is a failure of the channel, named, not a notice and not a crash.
    aws.lifecycle_state = "<html>proxy error</html>"
    await recorder.until(lambda: recorder.failures, "the garbled answer reported")
    await stop(task, provider)
    channel, error = recorder.failures[-1]
    assert (channel, error.kind) == ("aws/lifecycle", "body")
    assert "not a lifecycle state" in str(error)


async def test_aws_documents_restamped_on_every_read_are_one_notice_each() -> None:
    # AWS's own metadata mock re-stamps the spot time to "now + 2 min" and the rebalance
    # noticeTime to "now" on each read. Keyed on the whole body, every read was a new notice
    # that withdrew the last (65 node annotation writes and 107 withdrawals in 58 s), and the
    # deadline slid forever, so nothing was ever evicted.
    server = AwsMetadata(restamp=True)
    await server.start()
    server.instance_action = {"action": "terminate", "time": "2026-11-30T10:02:00Z"}
    server.rebalance = {"noticeTime": "2026-11-30T10:00:00Z"}
    provider = AwsProvider(settings=fast(server.url), clock=lambda: datetime.now(UTC))
    recorder = Recorder()
    task = await watching(provider, recorder)
    started = asyncio.get_running_loop().time()
    await recorder.until(
        lambda: (
            asyncio.get_running_loop().time() - started > 2.2
            and len(recorder.observed_by["aws/spot"]) >= 5
        ),
        "reads across more than two seconds",
    )
    await stop(task, provider)
    await server.close()
    spot = [n for seen in recorder.observed_by["aws/spot"] for n in seen]
    rebalance = [n for seen in recorder.observed_by["aws/rebalance"] for n in seen]
    assert len({n.deadline for n in spot}) > 1  # the server really moved the time
    assert {n.event_id for n in spot} == {"aws-spot-terminate"}
    assert {n.event_id for n in rebalance} == {"aws-rebalance"}
    store = Store(StoreSettings())
    new = [store.observe("aws/spot", seen, NOW) for seen in recorder.observed_by["aws/spot"]]
    assert [ids for ids in new if ids] == [["aws-spot-terminate"]]  # detected once, never again
    [tracked] = store.active()
    assert tracked.notice.deadline == min(n.deadline for n in spot)  # it never slides later


async def test_aws_expired_token_is_renewed_without_reporting_a_failure(
    aws: AwsMetadata,
) -> None:
    provider = aws_provider(aws)
    recorder = Recorder()
    task = await watching(provider, recorder)
    await recorder.until(lambda: recorder.latest("aws/spot") is not None, "a first read")
    aws.expire_tokens()
    aws.instance_action = {"action": "stop", "time": "2026-11-30T10:02:00Z"}
    await recorder.until(lambda: recorder.latest("aws/spot"), "the spot notice")
    await stop(task, provider)
    assert aws.unauthorized >= 1
    assert aws.token_puts >= 2
    assert recorder.failures == []


async def test_aws_falls_back_to_imdsv1_when_tokens_are_refused() -> None:
    server = AwsMetadata(token_api=False)
    await server.start()
    provider = aws_provider(server)
    recorder = Recorder()
    server.instance_action = {"action": "hibernate", "time": "2026-11-30T10:02:00Z"}
    task = await watching(provider, recorder)
    await recorder.until(lambda: recorder.latest("aws/spot"), "the spot notice over IMDSv1")
    await stop(task, provider)
    await server.close()
    assert provider.token.mode == "plain"
    assert recorder.failures == []


async def test_aws_token_is_refreshed_before_it_expires(aws: AwsMetadata) -> None:
    clock = [0.0]
    token = SessionToken(
        Http(HttpSettings(aws.url)),
        "/latest/api/token",
        "X-aws-ec2-metadata-token-ttl-seconds",
        "X-aws-ec2-metadata-token",
        ttl=100,
        monotonic=lambda: clock[0],
    )
    await token.get("/latest/meta-data/spot/instance-action")
    clock[0] = 80.0  # within the TTL (100 s), but inside its last quarter
    await token.get("/latest/meta-data/spot/instance-action")
    clock[0] = 81.0
    await token.get("/latest/meta-data/spot/instance-action")
    await token.http.aclose()
    assert aws.token_puts == 2
    assert aws.unauthorized == 0


@pytest.mark.parametrize("fault", ["503", "500", "garbage", "oversize", "html", "truncated-json"])
async def test_aws_bad_answers_are_reported_and_a_later_notice_is_still_seen(
    aws: AwsMetadata, fault: str
) -> None:
    aws.instance_action = {"action": "terminate", "time": "2026-11-30T10:02:00Z"}
    aws.faults.next(fault, fault, fault, fault, fault, fault)
    provider = aws_provider(aws)
    recorder = Recorder()
    task = await watching(provider, recorder)
    await recorder.until(lambda: recorder.latest("aws/spot"), "the notice after the faults")
    await stop(task, provider)
    assert len(recorder.failures) >= 2
    expected = {"503": "status", "500": "status", "oversize": "too-large"}.get(fault, "body")
    assert expected in recorder.kinds()


async def test_aws_slow_answer_times_out_and_is_reported(aws: AwsMetadata) -> None:
    aws.faults.slow_seconds = 2.0
    aws.faults.next("slow")
    provider = aws_provider(aws, timeout=0.2)
    recorder = Recorder()
    task = await watching(provider, recorder)
    await recorder.until(lambda: "unreachable" in recorder.kinds(), "a timeout")
    await recorder.until(lambda: recorder.latest("aws/spot") == [], "a read after the timeout")
    await stop(task, provider)


async def test_aws_unreachable_server_is_reported_not_raised() -> None:
    provider = AwsProvider(settings=fast("http://127.0.0.1:9"))
    recorder = Recorder()
    task = await watching(provider, recorder)
    await recorder.until(lambda: len(recorder.failures) >= 6, "repeated failures")
    assert not task.done()
    await stop(task, provider)
    assert recorder.kinds() == {"unreachable"}


async def test_aws_far_future_time_is_capped_and_past_time_stands(aws: AwsMetadata) -> None:
    provider = aws_provider(aws)
    aws.instance_action = {"action": "terminate", "time": "2030-01-01T00:00:00Z"}
    (capped,) = await provider.spot()
    assert capped.deadline == NOW + timedelta(minutes=5)
    aws.instance_action = {"action": "terminate", "time": "2020-01-01T00:00:00Z"}
    (past,) = await provider.spot()
    assert past.deadline == datetime(2020, 1, 1, tzinfo=UTC)
    await provider.aclose()


async def test_aws_rebalance_only_cordons_and_canceled_maintenance_is_withdrawn(
    aws: AwsMetadata,
) -> None:
    provider = aws_provider(aws)
    aws.rebalance = {"noticeTime": "2026-11-30T10:00:00Z"}
    (rebalance,) = await provider.rebalance()
    assert rebalance.disruptive is False
    event = {
        "Code": "system-reboot",
        "Description": "scheduled reboot",
        "EventId": "instance-event-0d59937288b749b32",
        "NotBefore": "21 Dec 2026 01:00:00 GMT",
        "NotAfter": "21 Dec 2026 07:00:00 GMT",
        "State": "active",
    }
    aws.maintenance = [event]
    (reboot,) = await provider.maintenance()
    assert (reboot.kind, reboot.deadline) == (Kind.REBOOT, datetime(2026, 12, 21, 1, tzinfo=UTC))
    aws.maintenance = [{**event, "State": "canceled"}]
    assert await provider.maintenance() == []
    await provider.aclose()


# --- GCP ----------------------------------------------------------------------------------------


async def test_gcp_preemption_arrives_through_the_long_poll() -> None:
    server = GcpMetadata()
    await server.start()
    provider = GcpProvider(
        settings=HttpSettings(server.url + "/computeMetadata/v1", interval=5.0, timeout=0.5),
        clock=lambda: NOW,
    )
    recorder = Recorder()
    task = await watching(provider, recorder)
    await recorder.until(lambda: recorder.latest("gcp/preempted") == [], "the first read")
    await recorder.until(lambda: server.long_polls >= 2, "both long-polls to be waiting")
    # With a 5 s poll interval, only the long-poll can deliver this before the test times out.
    server.set("instance/preempted", "TRUE")
    await recorder.until(lambda: recorder.latest("gcp/preempted"), "the preemption")
    (notice,) = recorder.latest("gcp/preempted") or []
    assert (notice.kind, notice.deadline) == (Kind.PREEMPT, NOW + timedelta(seconds=30))
    server.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
    await recorder.until(lambda: recorder.latest("gcp/maintenance"), "the migration")
    (migration,) = recorder.latest("gcp/maintenance") or []
    assert not migration.disruptive
    await stop(task, provider)
    await server.close()
    assert recorder.failures == []


async def test_gcp_503_blips_are_tolerated() -> None:
    server = GcpMetadata()
    await server.start()
    server.faults.next("503", "503", "garbage")
    server.set("instance/preempted", "TRUE")
    provider = GcpProvider(settings=fast(server.url + "/computeMetadata/v1"))
    recorder = Recorder()
    task = await watching(provider, recorder)
    await recorder.until(lambda: recorder.latest("gcp/preempted"), "the preemption")
    await stop(task, provider)
    await server.close()
    assert {"status", "body"} <= recorder.kinds()


async def test_gcp_answer_without_the_flavor_header_is_not_believed(aws: AwsMetadata) -> None:
    # An AWS-style server at the GCP address: a 404 for these paths, never a Google answer.
    provider = GcpProvider(settings=fast(aws.url + "/latest/meta-data"))
    recorder = Recorder()
    task = await watching(provider, recorder)
    await recorder.until(lambda: len(recorder.failures) >= 2, "failures")
    await stop(task, provider)
    assert recorder.observed_by == {}


# --- Azure --------------------------------------------------------------------------------------


def azure_event(event_id: str, kind: str, resources: list[str], **extra: str) -> dict[str, Any]:
    return {
        "EventId": event_id,
        "EventType": kind,
        "ResourceType": "VirtualMachine",
        "Resources": resources,
        "EventStatus": "Scheduled",
        "NotBefore": "Mon, 30 Nov 2026 10:00:30 GMT",
        "Description": "",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
        **extra,
    }


async def test_azure_preempt_for_this_vm_is_a_notice_and_is_acknowledged() -> None:
    server = AzureMetadata(vm_name="vm-7")
    await server.start()
    server.set_events(
        [
            azure_event("A-1", "Preempt", ["vm-7"]),
            azure_event("B-2", "Reboot", ["vm-3"]),
            azure_event("C-3", "Freeze", ["vm-7", "vm-3"]),
        ]
    )
    provider = AzureProvider(settings=fast(server.url), clock=lambda: NOW)
    notices = {n.upstream_id: n for n in await provider.events()}
    assert set(notices) == {"A-1", "C-3"}
    assert notices["A-1"].kind is Kind.PREEMPT
    assert notices["A-1"].deadline == NOW + timedelta(seconds=30)
    assert not notices["C-3"].disruptive
    await provider.acknowledge(notices["A-1"])
    assert server.approved == ["A-1"]
    # Once started, the event has no NotBefore: the deadline is when it was seen.
    (started,) = [n for n in await provider.events() if n.upstream_id == "A-1"]
    assert started.deadline == NOW
    await provider.aclose()
    await server.close()


async def test_azure_refuses_requests_without_the_metadata_header() -> None:
    server = AzureMetadata()
    await server.start()
    http = Http(HttpSettings(server.url))
    resp = await http.request(
        "GET", "/metadata/scheduledevents", params={"api-version": "2020-07-01"}
    )
    assert resp.status == 400
    await http.aclose()
    await server.close()


async def test_azure_garbage_and_unknown_types_are_reported() -> None:
    server = AzureMetadata()
    await server.start()
    server.set_events([azure_event("X", "Explode", [])])
    provider = AzureProvider(settings=fast(server.url))
    recorder = Recorder()
    task = await watching(provider, recorder)
    await recorder.until(lambda: recorder.failures, "a failure")
    server.set_events([azure_event("T-1", "Terminate", [])])
    await recorder.until(lambda: recorder.latest("azure"), "the terminate notice")
    await stop(task, provider)
    await server.close()


# --- Alibaba ------------------------------------------------------------------------------------


@pytest.mark.parametrize("hardened", [False, True])
async def test_alibaba_termination_time(hardened: bool) -> None:
    server = AlibabaMetadata(hardened=hardened)
    await server.start()
    provider = AlibabaProvider(settings=fast(server.url), clock=lambda: NOW)
    assert await provider.termination() == []
    server.termination_time = "2026-11-30T10:05:00Z"
    (notice,) = await provider.termination()
    assert notice.deadline == NOW + timedelta(minutes=5)
    assert notice.event_id == (await provider.termination())[0].event_id
    server.termination_time = "not a time"
    with pytest.raises(ProviderError):
        await provider.termination()
    await provider.aclose()
    await server.close()


# --- Times at the ends of the calendar ----------------------------------------------------------


@pytest.mark.parametrize(
    "stated", ["0001-01-01T00:00:00Z", "0001-01-01T00:30:00+01:00", "9999-12-31T23:59:59Z"]
)
async def test_aws_times_at_the_ends_of_the_calendar_are_bad_bodies(
    aws: AwsMetadata, stated: str
) -> None:
    # Year 1 once reached the store, where "deadline - evict margin" overflowed in every
    # reconcile; a rebalance at year 9999 overflowed when its lead was added.
    provider = aws_provider(aws)
    aws.instance_action = {"action": "terminate", "time": stated}
    aws.rebalance = {"noticeTime": stated}
    with pytest.raises(BadBody, match="out of range"):
        await provider.spot()
    with pytest.raises(BadBody, match="out of range"):
        await provider.rebalance()
    await provider.aclose()


@pytest.mark.parametrize(
    "not_before", ["1 Jan 99999999999999999999 00:00:00 GMT", "Mon, 1 Jan 1900 00:00:00 GMT"]
)
async def test_maintenance_dates_out_of_range_are_bad_bodies(
    aws: AwsMetadata, not_before: str
) -> None:
    provider = aws_provider(aws)
    aws.maintenance = [
        {"Code": "system-reboot", "EventId": "e-1", "NotBefore": not_before, "State": "active"}
    ]
    with pytest.raises(BadBody, match="NotBefore"):
        await provider.maintenance()
    await provider.aclose()


async def test_an_action_or_event_type_that_is_not_a_string_is_a_bad_body(
    aws: AwsMetadata,
) -> None:
    # A list here was a TypeError out of the parser ("provider crashed" in the log, with a
    # traceback), not a bad answer from the metadata server.
    provider = aws_provider(aws)
    aws.instance_action = {"action": [], "time": "2026-11-30T10:02:00Z"}  # type: ignore[dict-item]
    with pytest.raises(BadBody, match="action"):
        await provider.spot()
    await provider.aclose()
    server = AzureMetadata()
    await server.start()
    server.set_events([azure_event("X-1", [], ["vm-0"])])  # type: ignore[arg-type]
    azure = AzureProvider(settings=fast(server.url), clock=lambda: NOW)
    with pytest.raises(BadBody, match="EventType"):
        await azure.events()
    await azure.aclose()
    await server.close()
