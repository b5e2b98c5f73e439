"""Node agent benchmark: API requests per agent, idle and under a notice.

What the API server counts itself, and what goes over the wire.

A devcluster is started here with ``--agents`` kwok nodes, each holding a worker and a sidecar,
and one agent per node (``--provider none``, ``--gpu off``: no cloud, no notice; the default
Kubernetes-side signals, so the node's taints are followed). Two counts are taken over the same
idle ``--seconds``:

- the API server's own ``apiserver_request_total`` (from its ``/metrics``), by verb and
  resource, for the resources an agent uses (nodes, pods, events; not their ``status``
  subresources, which kwok writes), less what the cluster did on its own over
  ``--baseline-seconds`` with the nodes and pods in place and no agent (kube-controller-manager,
  kube-scheduler and kwok; scaled to the same time), per agent. A watch is counted when it ends.
- the requests on the wire: the agents reach the API server through a counting proxy on
  loopback (their kubeconfig names ``http://127.0.0.1:PORT``; the proxy forwards each request
  over TLS with the admin certificate, streaming answers as they come so a watch stays open),
  counted by verb (``watch`` for a watch) and resource path.

With ``--notice-seconds S``, a third count follows the idle one: every node is then tainted
``karpenter.sh/disrupted:NoSchedule`` (one of the agent's default taint signals, so each agent
holds a notice with the default 120 s lead: it annotates its node and pods, writes Events, and
evicts the worker at the deadline) and the requests are counted over the next ``S`` seconds,
less the bench's own taint patches (a GET and a PATCH per node) and the cluster's own share at
idle, per agent. What the cluster does in answer to the agents (kwok deleting an evicted pod)
is not subtracted: the table shows it by resource.

``--checkout DIR`` runs the agents from another checkout (its ``nodeagent`` package first on the
path), to compare with an earlier version:

    git archive <commit> | tar -x -C /tmp/shoal-before
    .venv/bin/python bench/agent_api_requests.py --agents 50 --seconds 600 \
        --checkout /tmp/shoal-before
    .venv/bin/python bench/agent_api_requests.py --agents 50 --seconds 600
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web
from kubernetes import client, config

from devcluster import build, cluster, nodes
from nodeagent.adapters.k8s.transport import from_kubeconfig
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
            # No connection limit: aiohttp's default of 100 is taken up by 50 agents' two watches
            # each, and every other request would wait in the proxy, unseen by the API server.
            connector=aiohttp.TCPConnector(ssl=self._ssl or True, limit=0),
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
            try:
                await answer.prepare(request)
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


#: The resources an agent reads and writes (``apiserver_request_total``'s ``resource`` label).
AGENT_RESOURCES = ("nodes", "pods", "events")
_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def server_counts(kubeconfig: str) -> collections.Counter[str]:
    """``apiserver_request_total`` by verb and resource (``PATCH nodes``, ``POST pods/eviction``),
    for :data:`AGENT_RESOURCES` (no subresource but eviction), read from the API server's
    ``/metrics``."""
    upstream = from_kubeconfig(kubeconfig)
    with urllib.request.urlopen(  # noqa: S310 (the devcluster's own https URL)
        upstream.server.rstrip("/") + "/metrics", context=upstream.context, timeout=30
    ) as answer:
        text = answer.read().decode()
    counts: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        if labels.get("resource") not in AGENT_RESOURCES:
            continue
        if labels.get("subresource", "") not in ("", "eviction"):
            continue
        key = f"{labels['verb']} {labels['resource']}/{labels.get('subresource', '')}".rstrip("/")
        counts[key] += round(float(match["value"]))
    return counts


def wire_kind(what: str) -> str:
    """``GET /api/v1/namespaces/ns/pods/x`` as ``GET pods``."""
    verb, _, path = what.partition(" ")
    parts = [p for p in path.split("/") if p]
    kinds = [p for p in parts if p in AGENT_RESOURCES or p in ("eviction",)]
    return f"{verb} {kinds[-1] if kinds else path}"


def start_agents(agents: list[AgentProcess]) -> None:
    """Start them a few at a time (each waits until its /readyz answers)."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda a: a.start(), agents))


def measure(
    kubeconfig: str,
    core: Any,
    *,
    agents: int,
    seconds: float,
    baseline: float,
    settle: float,
    checkout: str | None,
    work: Path,
    notice_seconds: float = 0.0,
) -> None:
    work.mkdir(parents=True, exist_ok=True)
    spec = nodes.NodeSpec(count=agents, gpus=8, prefix=f"bench-api-{uuid.uuid4().hex[:6]}")
    names = nodes.create(kubeconfig, spec)
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    pods: list[str] = []
    for i, node in enumerate(names):
        for name, worker in ((f"trainer-{i}", True), (f"metrics-sidecar-{i}", False)):
            pod = worker_pod(name, node, worker=worker)
            core.create_namespaced_pod(namespace, pod)
            pods.append(name)
    proxy = CountingProxy(kubeconfig).start()
    proxied = proxied_kubeconfig(kubeconfig, proxy.port, work / "proxied.kubeconfig")
    running = [
        AgentProcess(
            kubeconfig=proxied,
            node=node,
            provider="none",
            metadata_url="http://127.0.0.1:9",
            workdir=work / node,
            extra=["--gpu", "off"],
            # -P: the working folder is not put first on the path, so PYTHONPATH decides which
            # checkout's agent runs.
            env={"PYTHONPATH": checkout or str(Path(__file__).resolve().parents[1])},
            python=[sys.executable, "-P"],
        )
        for node in names
    ]
    for agent in running:
        agent.workdir.mkdir(parents=True, exist_ok=True)
    try:
        time.sleep(settle)  # the nodes and pods in place, no agent: the cluster's own share
        base_before, started = server_counts(kubeconfig), time.monotonic()
        time.sleep(baseline)
        base = server_counts(kubeconfig) - base_before
        base_took = time.monotonic() - started

        start_agents(running)
        time.sleep(settle)  # past the start (restore, first lists, first watches)
        wire_before, server_before = proxy.snapshot(), server_counts(kubeconfig)
        started = time.monotonic()
        time.sleep(seconds)
        wire, server = proxy.snapshot() - wire_before, server_counts(kubeconfig) - server_before
        took = time.monotonic() - started
        if notice_seconds > 0:
            noticed = under_notice(kubeconfig, core, proxy, names, notice_seconds)
    finally:
        for agent in running:
            agent.stop()
        for name in pods:
            release(core, namespace, name)
        core.delete_namespace(namespace)
        for node in names:
            core.delete_node(node)
    report(agents, checkout, took=took, base_took=base_took, server=server, base=base, wire=wire)
    if notice_seconds > 0:
        n_took, n_server, n_wire = noticed
        print()
        print(f"under a notice (every node tainted {NOTICE_TAINT}), {n_took:.0f} s:")
        report(
            agents,
            checkout,
            took=n_took,
            base_took=base_took,
            server=n_server,
            base=base,
            wire=n_wire,
            per_notice=True,
        )


#: A taint the agent follows by default (``--kube-taints``), that no controller here acts on.
NOTICE_TAINT = "karpenter.sh/disrupted"


def under_notice(
    kubeconfig: str, core: Any, proxy: CountingProxy, names: list[str], seconds: float
) -> tuple[float, collections.Counter[str], collections.Counter[str]]:
    """Taint every node at once, then count the requests over ``seconds``."""
    wire_before, server_before = proxy.snapshot(), server_counts(kubeconfig)
    started = time.monotonic()
    for node in names:
        taints = core.read_node(node).spec.taints or []
        body = [{"key": t.key, "value": t.value, "effect": t.effect} for t in taints if t.key] + [
            {"key": NOTICE_TAINT, "effect": "NoSchedule"}
        ]
        core.patch_node(node, {"spec": {"taints": body}})
    time.sleep(max(0.0, seconds - (time.monotonic() - started)))
    took = time.monotonic() - started
    # The bench's own node reads (one GET per node) are not the agents' either.
    server = server_counts(kubeconfig) - server_before
    server["GET nodes"] = max(0, server["GET nodes"] - len(names))
    return took, server, proxy.snapshot() - wire_before


def report(
    agents: int,
    checkout: str | None,
    *,
    took: float,
    base_took: float,
    server: collections.Counter[str],
    base: collections.Counter[str],
    wire: collections.Counter[str],
    per_notice: bool = False,
) -> None:
    if not per_notice:
        print(f"{agents} agents from {checkout or 'this checkout'}, idle for {took:.0f} s")
    print("apiserver_request_total, nodes/pods/events, per agent (less the cluster's own at idle):")
    total = 0.0
    for verb in sorted(set(server) | set(base)):
        own = base[verb] * took / base_took
        rate = max(0.0, server[verb] - own) / took / agents
        total += rate
        print(
            f"  {verb:22} {rate:.4f}/s  (all agents {server[verb]}, the cluster alone about "
            f"{own:.0f})"
        )
    print(
        f"  {'all':22} {total:.4f}/s per agent"
        + (f", {total * took:.1f} in all" if per_notice else "")
    )
    print("on the wire, per agent:")
    by_kind: collections.Counter[str] = collections.Counter()
    for what, n in wire.items():
        by_kind[wire_kind(what)] += n
    for what, n in sorted(by_kind.items()):
        print(f"  {what:14} {n / took / agents:.4f}/s")
    wired = sum(by_kind.values()) / agents
    print(
        f"  all            {wired / took:.4f}/s per agent"
        + (f", {wired:.1f} in all" if per_notice else "")
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=50)
    p.add_argument("--seconds", type=float, default=600.0)
    p.add_argument(
        "--baseline-seconds",
        type=float,
        help="seconds of the cluster on its own, before the agents start (default: --seconds)",
    )
    p.add_argument("--settle", type=float, default=20.0, help="seconds before each count")
    p.add_argument("--checkout", help="run the agents from this checkout (default: this one)")
    p.add_argument(
        "--notice-seconds",
        type=float,
        default=0.0,
        help="then taint every node and count this long under the notice (0: no notice)",
    )
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="shoal-bench-api-") as tmp:
        work = Path(tmp)
        handle = cluster.up(work / "cluster", build.build(), cluster.Options(die_with_parent=True))
        api = config.new_client_from_config(config_file=str(handle.kubeconfig))
        try:
            measure(
                str(handle.kubeconfig),
                client.CoreV1Api(api),
                agents=args.agents,
                seconds=args.seconds,
                baseline=args.baseline_seconds or args.seconds,
                settle=args.settle,
                checkout=args.checkout,
                work=work / "agents",
                notice_seconds=args.notice_seconds,
            )
        finally:
            api.close()
            cluster.down(work / "cluster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
