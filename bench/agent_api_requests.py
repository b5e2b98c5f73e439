"""Node agent benchmark: API requests per minute at idle, counted on the wire.

The agent reaches a devcluster (started here) through a counting proxy on loopback: the agent's
kubeconfig names ``http://127.0.0.1:PORT``, and the proxy forwards each request to the API
server over TLS with the admin certificate, streaming answers as they come (a watch stays open
through it). Each request is counted by verb (``watch`` for a watch) and resource path. The
agent runs for one node holding a worker and a sidecar, with no cloud (``--provider none``) and
no notice: only what it asks of the API server to follow its pods.

``--checkout DIR`` runs the agent from another checkout (its ``nodeagent`` package first on the
path), to compare with an earlier version:

    git archive <commit> | tar -x -C /tmp/shoal-before
    .venv/bin/python bench/agent_api_requests.py --seconds 180 --checkout /tmp/shoal-before
    .venv/bin/python bench/agent_api_requests.py --seconds 180
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web
from kubernetes import client, config

from devcluster import build, cluster, nodes
from nodeagent.k8s.transport import from_kubeconfig
from tests.integration.nodeagent.harness import AgentProcess, release, worker_pod

#: Not forwarded: hop-by-hop headers, and what the proxy sets itself.
_DROP = {"host", "connection", "transfer-encoding", "content-length", "keep-alive"}


class CountingProxy:
    """Plain HTTP in, TLS to the API server out; counts every request."""

    def __init__(self, kubeconfig: str) -> None:
        upstream = from_kubeconfig(kubeconfig)
        self.server = upstream.server.rstrip("/")
        self._ssl = upstream.context
        self.counts: collections.Counter[str] = collections.Counter()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="counting-proxy")

    def start(self) -> CountingProxy:
        self._thread.start()
        self._ready.wait(30)
        return self

    def snapshot(self) -> collections.Counter[str]:
        return collections.Counter(self.counts)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._listen())
        self._ready.set()
        self._loop.run_forever()

    async def _listen(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._ssl),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
        )
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        verb = "watch" if request.query.get("watch") in ("true", "1") else request.method
        self.counts[f"{verb} {request.path}"] += 1
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}
        body = await request.read()
        async with self._session.request(
            request.method,
            self.server + request.path_qs,
            headers=headers,
            data=body or None,
        ) as upstream:
            answer = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in _DROP and key.lower() != "content-encoding":
                    answer.headers[key] = value
            await answer.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await answer.write(chunk)
                await answer.write_eof()
            except (ConnectionError, aiohttp.ClientError):
                pass  # the agent closed its end (a watch it ended, or the agent stopped)
            return answer


def proxied_kubeconfig(kubeconfig: str, port: int, path: Path) -> str:
    doc = yaml.safe_load(Path(kubeconfig).read_text())
    for entry in doc["clusters"]:
        entry["cluster"] = {"server": f"http://127.0.0.1:{port}"}
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def measure(
    kubeconfig: str, core: Any, *, seconds: float, checkout: str | None, work: Path
) -> None:
    work.mkdir(parents=True, exist_ok=True)
    spec = nodes.NodeSpec(count=1, gpus=8, prefix=f"bench-api-{uuid.uuid4().hex[:6]}")
    (node,) = nodes.create(kubeconfig, spec)
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    for name, worker in (("trainer-0", True), ("metrics-sidecar", False)):
        core.create_namespaced_pod(namespace, worker_pod(name, node, worker=worker))
    proxy = CountingProxy(kubeconfig).start()
    agent = AgentProcess(
        kubeconfig=proxied_kubeconfig(kubeconfig, proxy.port, work / "proxied.kubeconfig"),
        node=node,
        provider="none",
        metadata_url="http://127.0.0.1:9",
        workdir=work,
        # -P: the working folder is not put first on the path, so PYTHONPATH decides which
        # checkout's agent runs.
        env={"PYTHONPATH": checkout or str(Path(__file__).resolve().parents[1])},
        python=[sys.executable, "-P"],
    )
    agent.start()
    try:
        time.sleep(5)  # past the start (restore, first list, first watch)
        before, started = proxy.snapshot(), time.monotonic()
        time.sleep(seconds)
        after, took = proxy.snapshot(), time.monotonic() - started
    finally:
        agent.stop()
        for name in ("trainer-0", "metrics-sidecar"):
            release(core, namespace, name)
        core.delete_namespace(namespace)
        core.delete_node(node)
    counted = after - before
    total = sum(counted.values())
    print(f"agent from {checkout or 'this checkout'}, idle for {took:.0f} s:")
    for what, n in sorted(counted.items()):
        print(f"  {what}: {n} ({n * 60 / took:.1f}/min)")
    print(f"  all requests: {total} ({total * 60 / took:.1f}/min)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=180.0)
    p.add_argument("--checkout", help="run the agent from this checkout (default: this one)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="shoal-bench-api-") as tmp:
        work = Path(tmp)
        handle = cluster.up(work / "cluster", build.build(), cluster.Options(die_with_parent=True))
        api = config.new_client_from_config(config_file=str(handle.kubeconfig))
        try:
            measure(
                str(handle.kubeconfig),
                client.CoreV1Api(api),
                seconds=args.seconds,
                checkout=args.checkout,
                work=work / "agent",
            )
        finally:
            api.close()
            cluster.down(work / "cluster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
