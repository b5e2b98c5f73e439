"""The agent under a hostile metadata server, over real HTTP both ways: it keeps answering
``/healthz``, names the fault in ``/readyz``, hands out no secret and takes no write."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import pytest

from fakes.metadata import AwsMetadata
from nodeagent.adapters.providers import HttpSettings
from nodeagent.adapters.providers.aws import AwsProvider
from nodeagent.core.events import Notice, Pod, Tracked
from nodeagent.wiring import health
from nodeagent.wiring.agent import Agent
from tests import figures

pytestmark = pytest.mark.reliability


class Cluster:
    """The API server side, in memory: always answers, writes nothing anywhere."""

    dry_run = False

    def __init__(self) -> None:
        self.last_ok = time.monotonic()

    def read_revocation(self) -> list[Tracked]:
        return []

    def list_pods(self) -> list[Pod]:
        self.last_ok = time.monotonic()
        return []

    def sync_node(self, tracked: Sequence[Tracked]) -> None: ...
    def annotate_pod(self, pod: Pod, notice: Notice) -> bool:
        return True

    def annotate_progress(self, pod: Pod, text: str) -> bool:
        return True

    def warn_pod(self, pod: Pod, reason: str, message: str) -> None:
        return None

    def clear_pod(self, pod: Pod) -> bool:
        return True

    def evict(self, pod: Pod, reason: str) -> bool:
        return True

    def delete(self, pod: Pod, grace_seconds: int) -> bool:
        return True

    def write_topology(self, text: str) -> None: ...


class QuickAws(AwsProvider):
    """Stale after a second without a good read, so a hang shows in /readyz quickly."""

    def stale_after(self) -> float:
        return 1.0


class Running:
    def __init__(self, server: AwsMetadata, agent: Agent, url: str) -> None:
        self.server = server
        self.agent = agent
        self.url = url
        self.http = aiohttp.ClientSession()

    async def get(self, path: str) -> tuple[int, str]:
        async with self.http.get(self.url + path, timeout=aiohttp.ClientTimeout(5)) as resp:
            return resp.status, await resp.text()

    async def until_unready(self, text: str) -> dict[str, Any]:
        for _ in range(200):
            async with self.http.get(self.url + "/readyz") as resp:
                body: dict[str, Any] = await resp.json()
                if resp.status == 503 and text in str(body["metadata"]):
                    return body
            await asyncio.sleep(0.05)
        pytest.fail(f"/readyz never named {text!r}")


@pytest.fixture
async def running() -> AsyncIterator[Running]:
    server = AwsMetadata()
    await server.start()
    provider = QuickAws(settings=HttpSettings(server.url, interval=0.05, timeout=0.3))
    agent = Agent(Cluster(), [provider], node_name="gpu-0")
    agent.start()
    runner, port = await health.serve(agent.reports, "127.0.0.1", 0)
    run = Running(server, agent, f"http://127.0.0.1:{port}")
    yield run
    await run.http.close()
    await agent.stop()
    await runner.cleanup()
    await server.close()


@pytest.mark.parametrize(
    ("fault", "named"),
    [("hang", "no answer within"), ("huge", "larger than"), ("wrong-type", "HTML page")],
)
async def test_a_hostile_metadata_server_is_named_in_readyz_and_healthz_stays_up(
    running: Running, fault: str, named: str
) -> None:
    running.server.faults.next(*[fault] * 10_000)
    body = await running.until_unready(named)
    assert "aws/" in " ".join(body["metadata"])
    assert (await running.get("/healthz"))[0] == 200
    status, text = await running.get("/status")
    assert status == 200
    assert named in text
    figures.record(
        "agent faults", f"metadata '{fault}' answers survived", running.server.faults.served
    )
    running.server.faults.queue.clear()
    running.server.instance_action = {"action": "terminate", "time": "2026-11-30T10:02:00Z"}
    for _ in range(200):
        if running.agent.store.active():
            break
        await asyncio.sleep(0.05)
    assert [t.notice.channel for t in running.agent.store.active()] == ["aws/spot"]


async def test_endpoints_take_no_writes_and_show_no_token(running: Running) -> None:
    for _ in range(200):
        if running.server.tokens and "aws/spot" in running.agent.reports.status()["channels"]:
            break
        await asyncio.sleep(0.05)
    (token,) = running.server.tokens
    before = running.agent.reports.status()
    refused = 0
    for path in ("/healthz", "/readyz", "/metrics", "/status"):
        status, text = await running.get(path)
        assert status in (200, 503)
        assert token not in text
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            async with running.http.request(method, running.url + path, data=b"{}") as resp:
                assert resp.status == 405, (method, path)
                assert token not in await resp.text()
                refused += 1
    after = running.agent.reports.status()
    assert (after["notices"], after["pods"]) == (before["notices"], before["pods"])
    figures.record("agent faults", "writes refused by the agent's endpoints", refused)
