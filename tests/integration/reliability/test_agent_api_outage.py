"""The node agent through an API server outage while a notice is live.

The agent reaches the API server through a loopback TCP proxy the test controls. For 100 s the
proxy blackholes it: connections are accepted and requests read, but nothing comes back (as when
the control plane's load balancer or network goes away; each request hangs until the client's
own timeout). A notice comes in from the fake Alibaba metadata server through the agent's real
provider, and the agent is killed with SIGKILL half-way through and started again, still without
an API server. Throughout, the agent's ``/healthz`` answers 200 (the DaemonSet's liveness probe
would otherwise restart it), the workers hear the notice over the real unix socket and their
acknowledgements are taken, by the first agent and by the restarted one; when the API server is
back, the agent catches up: the node is tainted and the acknowledging worker evicted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest
import yaml
from shoal_worker import PodIdentity

from contracts import names
from devcluster import nodes
from fakes import metadata
from fakes.clouds import Alibaba
from tests import figures
from tests.integration.conftest import Devcluster
from tests.integration.nodeagent.harness import (
    AgentProcess,
    Worker,
    disruption_target,
    eventually,
    release,
    taint,
    worker_pod,
)

pytestmark = pytest.mark.reliability

T = TypeVar("T")

SECTION = "agent through an API server outage"
OUTAGE_SECONDS = 100.0
KILL_AFTER_SECONDS = 45.0


@dataclass(eq=False)
class _Link:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    cut: bool = False


class ApiProxy:
    """A TCP proxy on 127.0.0.1 to the API server, on a thread and event loop of its own.

    :meth:`blackhole` cuts it off: open connections stop forwarding (the API server's side is
    closed, the client's kept open and read), and new ones are accepted and read, but never
    forwarded or answered. :meth:`restore` lets new connections through again.
    """

    def __init__(self, server: str) -> None:
        parts = urlsplit(server)
        assert parts.hostname is not None
        assert parts.port is not None
        self.host, self.port = parts.hostname, parts.port
        self.down = False
        self.swallowed = 0
        self._links: set[_Link] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="api-proxy")
        self._server: asyncio.Server | None = None
        self.url = ""

    def start(self) -> ApiProxy:
        self._thread.start()

        async def listen() -> asyncio.Server:
            return await asyncio.start_server(self._accept, "127.0.0.1", 0)

        self._server = self._call(listen())
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"https://127.0.0.1:{port}"
        return self

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    async def _swallow(self, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self.down:
                self.swallowed += 1
                await self._swallow(reader)
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
            except OSError:
                return
            link = _Link(writer, up_writer)
            self._links.add(link)
            try:
                await asyncio.gather(
                    self._pump(link, reader, up_writer),
                    self._pump(link, up_reader, writer),
                    return_exceptions=True,
                )
                if link.cut:  # the client's side stays open and unanswered
                    await self._swallow(reader)
            finally:
                self._links.discard(link)
                up_writer.close()
        finally:
            writer.close()

    async def _pump(
        self, link: _Link, source: asyncio.StreamReader, sink: asyncio.StreamWriter
    ) -> None:
        while data := await source.read(65536):
            if link.cut:
                return
            sink.write(data)
            await sink.drain()
        if not link.cut:
            sink.close()

    def blackhole(self) -> None:
        async def cut() -> None:
            self.down = True
            for link in list(self._links):
                link.cut = True
                link.upstream.close()

        self._call(cut())

    def restore(self) -> None:
        async def mend() -> None:
            self.down = False

        self._call(mend())

    def close(self) -> None:
        async def shut() -> None:
            if self._server is not None:
                self._server.close()
            for link in list(self._links):
                link.client.close()
                link.upstream.close()

        with contextlib.suppress(Exception):
            self._call(shut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def proxied_kubeconfig(devcluster: Devcluster, proxy: ApiProxy, path: Path) -> str:
    """The admin kubeconfig with the server replaced by the proxy (same certificates)."""
    doc = yaml.safe_load(Path(devcluster.kubeconfig).read_text())
    for entry in doc["clusters"]:
        entry["cluster"]["server"] = proxy.url
    path.write_text(json.dumps(doc))
    return str(path)


@dataclass
class HealthProbe:
    """Asks ``/healthz`` twice a second with the kubelet's default probe timeout (1 s), while
    the agent process is up; counts the answers that were not 200."""

    agent: AgentProcess
    checks: int = 0
    failed: list[str] = field(default_factory=list)
    paused: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> HealthProbe:
        self._thread = threading.Thread(target=self._run, name="healthz-probe", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            if self.paused.is_set():
                continue
            url = f"http://127.0.0.1:{self.agent.port}/healthz"
            try:
                with urllib.request.urlopen(url, timeout=1.0) as answer:
                    ok, detail = answer.status == 200, ""
            except urllib.error.HTTPError as exc:
                ok, detail = False, f"{exc.code}: {exc.read()[:300]!r}"
            except OSError as exc:
                ok, detail = False, str(exc)
            if self.paused.is_set():
                continue  # the agent was killed while this check ran
            self.checks += 1
            if not ok:
                self.failed.append(detail)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)


@pytest.fixture
def servers() -> Iterator[metadata.Threaded]:
    threaded = metadata.Threaded()
    yield threaded
    threaded.close()


def client_cli(pod: PodIdentity, socket_path: str, *args: str, timeout: float) -> tuple[int, str]:
    """``python -m nodeagent.client ARGS`` as a worker's launcher runs it."""
    env = {
        **os.environ,
        "POD_NAMESPACE": pod.namespace,
        "POD_NAME": pod.name,
        "POD_UID": pod.uid,
        "SHOAL_SOCKET": socket_path,
    }
    done = subprocess.run(
        [sys.executable, "-m", "nodeagent.client", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return done.returncode, (done.stdout + done.stderr).strip()


def test_api_server_outage_with_a_live_notice_and_a_kill_in_it(
    devcluster: Devcluster, namespace: str, servers: metadata.Threaded, tmp_path: Path
) -> None:
    core = devcluster.core()
    spec = nodes.NodeSpec(count=1, gpus=8, prefix=f"outage-{uuid.uuid4().hex[:6]}")
    (node,) = nodes.create(devcluster.kubeconfig, spec)
    pods: dict[str, PodIdentity] = {}
    for name, is_worker in (("trainer-0", True), ("metrics-sidecar", False)):
        created = core.create_namespaced_pod(namespace, worker_pod(name, node, worker=is_worker))
        pods[name] = PodIdentity(namespace, name, created.metadata.uid)
    proxy = ApiProxy(devcluster.handle.server).start()
    cloud = Alibaba(servers)  # a 5-minute lead: the deadline is after the outage
    agent = AgentProcess(
        kubeconfig=proxied_kubeconfig(devcluster, proxy, tmp_path / "proxied.kubeconfig"),
        node=node,
        provider="alibaba",
        metadata_url=cloud.url,
        workdir=tmp_path,
        extra=["--gpu", "off"],
        env={"SHOAL_STATE_DIR": str(tmp_path / "state")},
    )
    probe = HealthProbe(agent)
    worker: Worker | None = None
    try:
        agent.start()

        def listed() -> bool:
            return {p["pod"] for p in agent.status()["pods"]} == {f"{namespace}/{n}" for n in pods}

        eventually(listed, what="the agent to list its pods")
        worker = Worker(pods["trainer-0"], agent.socket_path)
        assert worker.next().state == "none"
        probe.start()

        proxy.blackhole()
        outage_began = time.monotonic()
        cloud.post()
        heard = worker.until("leave", timeout=30)
        first_heard_in = time.monotonic() - outage_began
        assert heard.source == "alibaba"
        assert worker.acknowledge(100) == "accepted"

        time.sleep(max(0.0, outage_began + KILL_AFTER_SECONDS - time.monotonic()))
        probe.paused.set()
        worker.close()
        worker = None
        agent.kill()
        restarted = time.monotonic()
        agent.start(until_ready=False)
        probe.paused.clear()
        _, readyz = agent.get("/readyz")
        assert readyz["api_server"] == "unreachable"

        # The restarted agent has never had an answer from the API server: it still knows its
        # worker, tells it, and takes its acknowledgement.
        code, out = client_cli(pods["trainer-0"], agent.socket_path, "wait", timeout=OUTAGE_SECONDS)
        assert code == 0, out
        delivered_in = time.monotonic() - restarted
        assert json.loads(out)["event_id"] == heard.event_id
        code, out = client_cli(pods["trainer-0"], agent.socket_path, "ack", "200", timeout=30)
        assert (code, out) == (0, "accepted")
        assert time.monotonic() - outage_began < OUTAGE_SECONDS, "outage too short for the test"
        assert taint(core.read_node(node)) is None  # nothing got through the proxy

        time.sleep(max(0.0, outage_began + OUTAGE_SECONDS - time.monotonic()))
        proxy.restore()
        outage = time.monotonic() - outage_began
        probe.stop()
        back = time.monotonic()

        evicted = eventually(
            lambda: disruption_target(core.read_namespaced_pod("trainer-0", namespace)),
            timeout=90,
            what="the acknowledging worker's eviction after the outage",
        )
        evicted_in = time.monotonic() - back
        assert evicted.reason == "EvictionByEvictionAPI"
        node_object = eventually(
            lambda: taint(core.read_node(node)) and core.read_node(node), what="the taint"
        )
        tainted_in = time.monotonic() - back
        assert taint(node_object).value == "alibaba"
        annotations = core.read_namespaced_pod("trainer-0", namespace).metadata.annotations or {}
        assert names.LEAVE_BY_ANNOTATION in annotations
        lines = agent.log_lines()
        reasons = [line.get("reason") for line in lines if line.get("event") == "pod_evicted"]
        assert "acknowledged" in reasons
        eventually(agent.ready, timeout=60, what="/readyz once the API server is back")

        figures.record(SECTION, "outage seconds (blackholed)", round(outage, 1))
        figures.record(SECTION, "/healthz checks during the outage", probe.checks)
        figures.record(SECTION, "/healthz checks failed", len(probe.failed))
        figures.record(SECTION, "seconds to the worker (first agent)", round(first_heard_in, 2))
        figures.record(
            SECTION, "seconds from kill -9 restart to the worker told", round(delivered_in, 2)
        )
        figures.record(SECTION, "seconds from API back to the eviction", round(evicted_in, 1))
        figures.record(SECTION, "seconds from API back to the taint", round(tainted_in, 1))
        figures.record(SECTION, "connections swallowed by the blackhole", proxy.swallowed)
        assert probe.checks >= OUTAGE_SECONDS  # twice a second, less the restart
        assert probe.failed == [], probe.failed[:5]
    finally:
        probe.stop()
        if worker is not None:
            worker.close()
        agent.stop()
        proxy.close()
        for name in pods:
            release(core, namespace, name)
        core.delete_node(node)
