"""An agent serving the Notices gRPC service on a real unix socket, its event loop in a thread
of its own, so that a test (and hypothesis) can call it with the ordinary blocking client.

The API server side is in memory and records every eviction and deletion: what a user would
notice of a wrong ack is their pod evicted before its deadline.

Every SocketAgent of a test process runs on one event loop that is never closed, so no gRPC
completion can be left for a loop that is gone. (A teardown timeout once seen in CI turned out to
be the agent itself: its reconcile loop swallowed the cancellation when it arrived as the loop was
woken, see ``test_the_agent_stops_when_told_to_as_its_reconcile_loop_is_woken``.)
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import grpc
from shoal_worker.protocol import notices_pb2 as pb
from shoal_worker.protocol import rpc

from nodeagent.core.events import EventId, Kind, Notice, Pod, PodKey, PodUid, Tracked
from nodeagent.notify.server import SocketLimits, serve
from nodeagent.wiring.agent import Agent

T = TypeVar("T")

#: The pods bound to this node: (namespace, name, uid).
PODS = (
    ("train", "worker-0", "6f1c0a52-0000-4000-8000-000000000000"),
    ("train", "worker-1", "6f1c0a52-0000-4000-8000-000000000001"),
)
CHANNEL = "aws/spot"


def identity(namespace: str, name: str, uid: str) -> pb.PodIdentity:
    return pb.PodIdentity(namespace=namespace, name=name, uid=uid)


def notice(event_id: str = "spot-1", lead: timedelta = timedelta(hours=1)) -> Notice:
    return Notice(
        event_id=EventId(event_id),
        source="aws",
        channel=CHANNEL,
        kind=Kind.TERMINATE,
        deadline=datetime.now(UTC) + lead,
        reason="spot interruption",
    )


class Cluster:
    """Always answers; keeps the evictions and deletions it was asked for."""

    dry_run = False

    def __init__(self) -> None:
        self.last_ok = time.monotonic()
        self.pods = [Pod(key=PodKey(f"{ns}/{name}"), uid=PodUid(uid)) for ns, name, uid in PODS]
        self.evicted: list[tuple[str, str]] = []
        self.deleted: list[str] = []
        self.warned: list[tuple[str, str, str]] = []
        #: Each shoal.dev/progress written: (pod, the document).
        self.progress: list[tuple[str, str]] = []

    def read_revocation(self) -> list[Tracked]:
        return []

    def list_pods(self) -> list[Pod]:
        self.last_ok = time.monotonic()
        return [p for p in self.pods if p.key not in self.deleted]

    def sync_node(self, tracked: Sequence[Tracked]) -> None: ...
    def annotate_pod(self, pod: Pod, notice: Notice) -> bool:
        return True

    def annotate_progress(self, pod: Pod, text: str) -> bool:
        self.progress.append((pod.key, text))
        return True

    def warn_pod(self, pod: Pod, reason: str, message: str) -> None:
        self.warned.append((pod.key, reason, message))

    def clear_pod(self, pod: Pod) -> bool:
        return True

    def evict(self, pod: Pod, reason: str) -> bool:
        self.evicted.append((pod.key, reason))
        return True

    def delete(self, pod: Pod, grace_seconds: int) -> bool:
        self.deleted.append(pod.key)
        return True

    def write_topology(self, text: str) -> None: ...


@functools.cache
def shared_loop() -> asyncio.AbstractEventLoop:
    """The one loop every SocketAgent of this process runs on (started on first use)."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="agents", daemon=True).start()
    return loop


class SocketAgent:
    """Start with :meth:`start`, stop with :meth:`stop`; ``stub`` is a blocking client."""

    def __init__(self, socket_path: Path, limits: SocketLimits | None = None) -> None:
        self.socket_path = str(socket_path)
        self.limits = limits
        self.cluster = Cluster()
        self.loop = shared_loop()
        self.agent: Agent | None = None
        self._server: Any = None
        self.channel: Any = None
        self.stub: Any = None

    def call(self, make: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Run a coroutine (made in the agent's loop) and wait for its result."""

        async def run() -> Any:
            return await make()

        future: Future[Any] = asyncio.run_coroutine_threadsafe(run(), self.loop)
        return future.result(timeout)

    def start(self) -> None:
        async def start() -> Agent:
            agent = Agent(self.cluster, [], node_name="gpu-0")
            self._server = await serve(agent.service, self.socket_path, self.limits)
            agent.start()
            return agent

        self.agent = self.call(start)
        self.channel = grpc.insecure_channel(f"unix:{self.socket_path}")
        self.stub = rpc.NoticesStub(self.channel)
        self.until(lambda: self.a.pods.restored, "the agent restored its state")

    @property
    def a(self) -> Agent:
        assert self.agent is not None
        return self.agent

    def stop(self) -> None:
        if self.channel is not None:
            self.channel.close()

        async def stop() -> None:
            await self.a.stop()
            await self._server.stop(0)

        self.call(stop)

    def observe(self, notices: Sequence[Notice]) -> None:
        """A metadata read of the spot channel that saw ``notices``."""

        async def observed() -> None:
            self.a.intake.observed(CHANNEL, notices)

        self.call(observed)

    def settle(self) -> None:
        """Wait until the reconcile loop has run at least twice more and no API write is under
        way (all that is due is done)."""
        start = self.a.reconciler.turns
        self.loop.call_soon_threadsafe(self.a.reconciler.wake)
        self.until(lambda: self.a.reconciler.turns >= start + 1, "the reconcile loop turned")
        self.loop.call_soon_threadsafe(self.a.reconciler.wake)
        self.until(
            lambda: self.a.reconciler.turns >= start + 2 and self.a.executor.pending == 0,
            "the reconcile loop turned again and its writes were done",
        )

    def until(self, check: Callable[[], T], what: str, seconds: float = 10.0) -> T:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            value = check()
            if value:
                return value
            time.sleep(0.01)
        raise AssertionError(f"timed out waiting until {what}")

    def acked(self) -> dict[str, object]:
        return {str(r["pod"]): r["acked_step"] for r in self.a.store.pod_report()}
