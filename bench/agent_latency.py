"""Node agent benchmark: detection latency per provider, resident memory, CPU idle and during
notices.

Detection latency is measured end to end, the way a worker sees it: from the moment a notice is
written into the fake metadata server to the moment a worker's gRPC watch on the agent's unix
socket receives it, with the agent at its default 1 s poll interval (GCP: long-poll). CPU "during
notices" is the agent's CPU over the rounds (a notice posted, seen, withdrawn, every ~1.5 s,
including its pod annotations and Events); "idle" is a quiet window after them. The agent
runs as a real process against a devcluster (started here, from the cached build), and as the
image runs it: with the product's own dependencies only, not the dev extra installed beside it.

    .venv/bin/python bench/agent_latency.py [--rounds 30] [--idle-seconds 30]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from kubernetes import config
from shoal_worker import PodIdentity

from devcluster import build, cluster, nodes, process
from fakes import metadata
from tests.integration.nodeagent.harness import (
    CLOUDS,
    AgentProcess,
    Worker,
    eventually,
    release,
    shipped,
    worker_pod,
)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[rank]


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """Resident memory; ``RssAnon`` is the part that is the process's own (heap, not the shared
    libraries' pages that every Python process on the node maps too)."""
    kib = process.status_kib(pid, field)
    return float("nan") if kib is None else kib / 1024


def run_provider(
    kubeconfig: str, core: Any, provider: str, *, rounds: int, idle: float, work: Path
) -> dict[str, float]:
    servers = metadata.Threaded()
    spec = nodes.NodeSpec(count=1, gpus=8, prefix=f"bench-{provider}-{uuid.uuid4().hex[:6]}")
    (node,) = nodes.create(kubeconfig, spec)
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    created = core.create_namespaced_pod(namespace, worker_pod("trainer-0", node))
    pod = PodIdentity(namespace, "trainer-0", created.metadata.uid)
    cloud = CLOUDS[provider](servers)
    # The agent as the image runs it: the product and its dependencies, no dev extra.
    python, env = shipped(work / "shipped")
    agent = AgentProcess(kubeconfig, node, provider, cloud.url, work / provider, python=python)
    agent.env.update(env)
    agent.workdir.mkdir(parents=True)
    agent.start()
    assert agent.proc is not None
    worker = Worker(pod, agent.socket_path)
    latencies: list[float] = []
    try:
        worker.until("none")
        busy_cpu0, busy_t0 = process.cpu_seconds(agent.proc.pid), time.monotonic()
        for _ in range(rounds):
            time.sleep(random.uniform(0.0, 1.0))  # a random phase against the poll  # noqa: S311
            cloud.renew()  # a fresh notice, not the withdrawn one again
            started = time.monotonic()
            cloud.post()
            worker.until("leave")
            latencies.append(time.monotonic() - started)
            cloud.withdraw()
            worker.until("withdrawn")
        busy = (process.cpu_seconds(agent.proc.pid) - busy_cpu0) / (time.monotonic() - busy_t0)
        rss = rss_mib(agent.proc.pid)
        before = process.cpu_seconds(agent.proc.pid)
        time.sleep(idle)
        cpu = (process.cpu_seconds(agent.proc.pid) - before) / idle
        rss = max(rss, rss_mib(agent.proc.pid))
        anon = rss_mib(agent.proc.pid, "RssAnon")
        peak = rss_mib(agent.proc.pid, "VmHWM")
        eventually(lambda: agent.get("/healthz")[0] == 200, what="healthz")
    finally:
        worker.close()
        agent.stop()
        servers.close()
        release(core, namespace, "trainer-0")
        core.delete_namespace(namespace)
        core.delete_node(node)
    return {
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "max_ms": max(latencies) * 1000,
        "rss_mib": rss,
        "anon_mib": anon,
        "idle_cpu_pct": cpu * 100,
        "notice_cpu_pct": busy * 100,
        "peak_rss_mib": peak,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30, help="notices per provider")
    p.add_argument("--idle-seconds", type=float, default=30.0, help="idle CPU window per agent")
    p.add_argument("--providers", default="aws,gcp,azure,alibaba")
    args = p.parse_args()
    from kubernetes import client

    with tempfile.TemporaryDirectory(prefix="shoal-bench-") as tmp:
        work = Path(tmp)
        handle = cluster.up(work / "cluster", build.build(), cluster.Options(die_with_parent=True))
        api = config.new_client_from_config(config_file=str(handle.kubeconfig))
        core = client.CoreV1Api(api)
        results = {}
        try:
            for provider in args.providers.split(","):
                results[provider] = run_provider(
                    str(handle.kubeconfig),
                    core,
                    provider,
                    rounds=args.rounds,
                    idle=args.idle_seconds,
                    work=work,
                )
        finally:
            api.close()
            cluster.down(work / "cluster")
    print(f"\nnode agent, {args.rounds} notices per provider, default 1 s poll (GCP: long-poll)")
    print(
        f"{'provider':<10}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'RSS MiB':>10}"
        f"{'anon MiB':>10}{'peak MiB':>10}{'idle CPU %':>12}{'notice CPU %':>14}"
    )
    for provider, r in results.items():
        print(
            f"{provider:<10}{r['p50_ms']:>9.0f}{r['p99_ms']:>9.0f}{r['max_ms']:>9.0f}"
            f"{r['rss_mib']:>10.1f}{r['anon_mib']:>10.1f}{r['peak_rss_mib']:>10.1f}"
            f"{r['idle_cpu_pct']:>12.2f}{r['notice_cpu_pct']:>14.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
