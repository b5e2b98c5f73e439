"""The agent with every API call hanging (an unreachable API server): workers are told and
their acks taken over the real notice socket, by a running agent and by one restarted from its
pod file; nothing is written until the API server answers, then the acked worker is evicted."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import pytest
from shoal_worker import LeaveNotice, NoticeClient, NoticeRefused, PodIdentity

from nodeagent.adapters.podcache import PodCache
from nodeagent.core.events import Notice, Pod, PodKey, PodUid, Tracked
from nodeagent.notify.server import serve
from nodeagent.wiring.agent import Agent, AgentSettings
from tests import waiting
from tests.unit.nodeagent.notice_socket import CHANNEL, PODS, notice

pytestmark = pytest.mark.reliability

NODE = "gpu-0"


class HangingCluster:
    """Answers while ``up`` is set; otherwise every call waits for it (as on a blackholed
    connection). Keeps every write it carried out."""

    dry_run = False

    def __init__(self) -> None:
        self.up = threading.Event()
        self.up.set()
        self.last_ok = 0.0
        self.pods = [Pod(key=PodKey(f"{ns}/{name}"), uid=PodUid(uid)) for ns, name, uid in PODS]
        self.writes: list[tuple[str, str]] = []

    def _answer(self) -> None:
        self.up.wait()
        self.last_ok = time.monotonic()

    def read_revocation(self) -> list[Tracked]:
        self._answer()
        return []

    def list_pods(self) -> list[Pod]:
        self._answer()
        return list(self.pods)

    def sync_node(self, tracked: Sequence[Tracked]) -> None:
        self._answer()
        self.writes.append(("sync", str(len(tracked))))

    def annotate_pod(self, pod: Pod, notice: Notice) -> bool:
        self._answer()
        self.writes.append(("annotate", pod.key))
        return True

    def annotate_progress(self, pod: Pod, text: str) -> bool:
        self._answer()
        self.writes.append(("progress", pod.key))
        return True

    def warn_pod(self, pod: Pod, reason: str, message: str) -> None:
        self._answer()
        self.writes.append(("warn", pod.key))

    def clear_pod(self, pod: Pod) -> bool:
        self._answer()
        self.writes.append(("clear", pod.key))
        return True

    def evict(self, pod: Pod, reason: str) -> bool:
        self._answer()
        self.writes.append((f"evict {reason}", pod.key))
        return True

    def delete(self, pod: Pod, grace_seconds: int) -> bool:
        self._answer()
        self.writes.append(("delete", pod.key))
        return True

    def write_topology(self, text: str) -> None:
        self._answer()


async def until(check: Callable[[], object], what: str, seconds: float = 10.0) -> None:
    await waiting.arrives(check, seconds=seconds, what=what)


class Node:
    """An agent on the notice socket, with a pod file in ``tmp``."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.socket = str(tmp / "agent.sock")
        self.clusters: list[HangingCluster] = []
        self.agent: Agent | None = None
        self._server: object = None

    async def start(self) -> Agent:
        cluster = HangingCluster()
        if self.clusters and not self.clusters[-1].up.is_set():
            cluster.up.clear()  # the API server is still down
        self.clusters.append(cluster)
        settings = AgentSettings(retry_after=0.05, identify_timeout=0.2)
        cache = PodCache(self.tmp / "state" / "pods.json", NODE)
        self.agent = Agent(cluster, [], node_name=NODE, settings=settings, pod_cache=cache)
        self._server = await serve(self.agent.service, self.socket)
        self.agent.start()
        return self.agent

    async def kill(self) -> None:
        assert self.agent is not None
        await self.agent.stop()
        await self._server.stop(0)  # type: ignore[attr-defined]

    def release(self) -> None:
        for cluster in self.clusters:
            cluster.up.set()


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    node = Node(tmp_path)
    try:
        yield node
    finally:
        node.release()  # lets the threads still waiting on the API server end
        await node.kill()


def worker(node: Node, index: int = 0) -> NoticeClient:
    return NoticeClient(PodIdentity(*PODS[index]), node.socket)


async def hear(client: NoticeClient, state: str) -> LeaveNotice:
    async def listen() -> LeaveNotice:
        async for update in client.watch():
            if update.state == state:
                return update
        raise AssertionError("the watch ended")

    return await asyncio.wait_for(listen(), 5)


async def test_workers_are_told_and_heard_through_an_outage_and_a_restart(node: Node) -> None:
    agent = await node.start()
    listed = {"restored": True, "pods_from": "api"}
    await until(
        lambda: listed.items() <= agent.reports.ready()[1].items(), "the agent listed its pods"
    )
    await until((node.tmp / "state" / "pods.json").exists, "the pod file was written")
    node.clusters[0].up.clear()  # the API server stops answering

    live = notice()
    told = asyncio.create_task(hear(worker(node), "leave"))
    await until(lambda: agent.board.watchers() == 1, "the worker watches")
    agent.intake.observed(CHANNEL, [live])
    assert (await told).event_id == live.event_id
    assert await worker(node).acknowledge(5) == "accepted"
    for _ in range(3):  # the reconcile loop turns while the writes it started hang
        turned = agent.reconciler.turns
        agent.reconciler.wake()
        await until(lambda: agent.reconciler.turns > turned, "the reconcile loop turned")  # noqa: B023
    assert agent.reports.live()[0]
    assert node.clusters[0].writes == []

    # Killed and started again, the API server still down: the pod file names the workers.
    await node.kill()
    agent = await node.start()
    assert agent.reports.ready()[1]["pods_from"] == "disk"
    agent.intake.observed(CHANNEL, [live])
    heard = await hear(worker(node, 1), "leave")  # a watch opened after the notice came
    assert heard.event_id == live.event_id
    assert await worker(node, 1).acknowledge(9) == "accepted"
    # A pod the file does not name is refused (not an error) without waiting on the API server.
    stranger = NoticeClient(PodIdentity("train", "worker-9", "not-a-pod"), node.socket)
    with pytest.raises(NoticeRefused, match="not-on-node"):
        await asyncio.wait_for(stranger.acknowledge(1), 5)
    with pytest.raises(NoticeRefused):
        await hear(stranger, "leave")
    assert agent.reports.live()[0]
    _, ready = agent.reports.ready()
    assert (ready["api_server"], ready["pods_from"], ready["restored"]) == (
        "unreachable",
        "disk",
        False,
    )
    cluster = node.clusters[-1]
    assert cluster.writes == []

    cluster.up.set()  # the API server is back: the restarted agent catches up
    await until(lambda: ("evict acknowledged", "train/worker-1") in cluster.writes, "eviction")
    assert ("sync", "1") in cluster.writes
    assert agent.reports.ready()[1]["pods_from"] == "api"


async def test_the_agent_stops_when_told_to_as_its_reconcile_loop_is_woken() -> None:
    """On Python 3.11, ``asyncio.wait_for`` returns the result instead of raising when the
    cancellation arrives as the awaited event is set: the reconcile loop then went round again
    and ``Agent.stop`` (the agent's answer to SIGTERM) waited for it forever."""
    agent = Agent(HangingCluster(), [], node_name=NODE)
    agent.start()
    await until(lambda: agent.reconciler.turns > 0, "the reconcile loop turned")
    agent.reconciler.wake()  # a notice, an ack or a write's result, as SIGTERM arrives
    async with asyncio.timeout(5):
        await agent.stop()
    assert agent.guard.dead() == ["pods", "reconcile", "progress"]
