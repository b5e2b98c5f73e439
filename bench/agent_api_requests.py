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

With ``--progress-every S``, a count with progress reports follows the idle one: the worker pod
of every node reports its progress through the worker library (``shoal_worker.ProgressReporter``,
over its agent's socket) every ``S`` seconds, with a new step each time, for
``--progress-seconds``; the same tables are printed, and the agents' progress writes (a PATCH of
a pod carrying ``shoal.dev/progress``, seen on the wire) per pod: per minute, the shortest gap
between two writes of one pod, and the most writes of one pod within any 59 s (the budget: one
write per pod per minute, ``contracts.progress.MIN_WRITE_INTERVAL_S``)::

    .venv/bin/python bench/agent_api_requests.py --agents 50 --seconds 180 \
        --progress-every 5 --progress-seconds 300

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
import itertools
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
from shoal_worker import NoticeClient, PodIdentity, ProgressReporter

from contracts import names as contract_names
from contracts.progress import MIN_WRITE_INTERVAL_S
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
        #: When each pod's shoal.dev/progress was patched (monotonic), by request path.
        self.progress_writes: dict[str, list[float]] = collections.defaultdict(list)
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
        if request.method == "PATCH" and _PROGRESS in body:
            self.progress_writes[request.path].append(time.monotonic())
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


_PROGRESS = contract_names.PROGRESS_ANNOTATION.encode()


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


def create_pods(core: Any, namespace: str, names: list[str]) -> tuple[list[str], list[PodIdentity]]:
    """A worker pod and a sidecar on each node; returns every pod's name and the workers."""
    pods: list[str] = []
    trainers: list[PodIdentity] = []
    for i, node in enumerate(names):
        for name, worker in ((f"trainer-{i}", True), (f"metrics-sidecar-{i}", False)):
            created = core.create_namespaced_pod(namespace, worker_pod(name, node, worker=worker))
            pods.append(name)
            if worker:
                trainers.append(PodIdentity(namespace, name, created.metadata.uid))
    return pods, trainers


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
    progress_every: float = 0.0,
    progress_seconds: float = 0.0,
) -> None:
    work.mkdir(parents=True, exist_ok=True)
    spec = nodes.NodeSpec(count=agents, gpus=8, prefix=f"bench-api-{uuid.uuid4().hex[:6]}")
    names = nodes.create(kubeconfig, spec)
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    pods, trainers = create_pods(core, namespace, names)
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
        if progress_every > 0:
            sockets = [agent.socket_path for agent in running]
            reported = reporting(
                kubeconfig,
                proxy,
                trainers=trainers,
                sockets=sockets,
                every=progress_every,
                seconds=progress_seconds,
                settle=settle,
            )
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
    if progress_every > 0:
        p_took, p_server, p_wire, writes = reported
        print()
        print(
            f"with progress reports (each node's worker pod every {progress_every:g} s through "
            f"the worker library), {p_took:.0f} s:"
        )
        report(
            agents,
            checkout,
            took=p_took,
            base_took=base_took,
            server=p_server,
            base=base,
            wire=p_wire,
            phase="reporting progress",
        )
        progress_report(writes, len(trainers), p_took)
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


def reporting(
    kubeconfig: str,
    proxy: CountingProxy,
    *,
    trainers: list[PodIdentity],
    sockets: list[str],
    every: float,
    seconds: float,
    settle: float,
) -> tuple[float, collections.Counter[str], collections.Counter[str], dict[str, list[float]]]:
    """Each trainer pod reports a new step every ``every`` seconds; after ``settle`` seconds
    (past each pod's first write, made at once), count the requests over ``seconds``; returns
    the time counted, the API server's and the wire's counts, and each pod's progress writes
    within it."""
    reporters = [
        ProgressReporter(NoticeClient(pod, socket))
        for pod, socket in zip(trainers, sockets, strict=True)
    ]
    stop = threading.Event()

    def report_all() -> None:
        step = 0
        while not stop.is_set():
            step += 1
            for reporter in reporters:
                reporter.report(step, step_seconds=every, checkpoint_step=step // 10 * 10)
            stop.wait(every)

    driver = threading.Thread(target=report_all, name="bench-progress", daemon=True)
    driver.start()
    try:
        time.sleep(settle)
        wire_before, server_before = proxy.snapshot(), server_counts(kubeconfig)
        started = time.monotonic()
        time.sleep(seconds)
        ended = time.monotonic()
        wire, server = proxy.snapshot() - wire_before, server_counts(kubeconfig) - server_before
    finally:
        stop.set()
        driver.join(timeout=30)
        for reporter in reporters:
            reporter.close()
    sent = sum(r.sent for r in reporters)
    print(f"progress reports taken by the agents: {sent} ({sent / len(reporters):.1f} per pod)")
    writes = {
        path: [t for t in times if started <= t < ended]
        for path, times in proxy.progress_writes.items()
    }
    return ended - started, server, wire, writes


def progress_report(writes: dict[str, list[float]], pods: int, took: float) -> None:
    """The agents' progress writes per pod: against the budget of one per pod per minute."""
    counts = [len(times) for times in writes.values()]
    total = sum(counts)
    gaps = [b - a for times in writes.values() for a, b in itertools.pairwise(sorted(times))]
    window = max(
        (_most_within(sorted(times), MIN_WRITE_INTERVAL_S - JITTER) for times in writes.values()),
        default=0,
    )
    print(f"progress writes (PATCH pods with {contract_names.PROGRESS_ANNOTATION}):")
    print(
        f"  {total} writes for {pods} reporting pods in {took:.0f} s: "
        f"{total / pods / (took / 60):.3f} per pod per minute "
        f"(budget {60 / MIN_WRITE_INTERVAL_S:g}); pods written {len(writes)}, "
        f"per pod {min(counts, default=0)}-{max(counts, default=0)}"
    )
    print(
        f"  shortest gap between two writes of one pod {min(gaps, default=float('nan')):.2f} s "
        f"(on the wire); most writes of one pod within any {MIN_WRITE_INTERVAL_S - JITTER:g} s: "
        f"{window}"
    )


#: Seconds by which two writes a minute apart at the agent may come closer on the wire (the API
#: thread's start, the proxy's reading).
JITTER = 1.0


def _most_within(times: list[float], span: float) -> int:
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= span:
            first += 1
        most = max(most, last - first + 1)
    return most


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
    phase: str = "idle",
) -> None:
    if not per_notice:
        print(f"{agents} agents from {checkout or 'this checkout'}, {phase} for {took:.0f} s")
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
    p.add_argument(
        "--progress-every",
        type=float,
        default=0.0,
        help="then have each node's worker pod report progress this often (seconds) and count "
        "(0: no reports)",
    )
    p.add_argument(
        "--progress-seconds",
        type=float,
        help="how long to count with progress reports (default: --seconds)",
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
                progress_every=args.progress_every,
                progress_seconds=args.progress_seconds or args.seconds,
            )
        finally:
            api.close()
            cluster.down(work / "cluster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
