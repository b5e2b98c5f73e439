"""Shoal as users run it: the chart installed with helm on a real node (kubelet, containerd and
runc, the images `make images` built), and a spot notice heard by a worker container.

Measures, on a devcluster with one real node (started here; needs root and the images):

- ``helm install --wait`` -> every pod of the release Ready, on a fresh cluster each run;
- a spot notice written into the fake AWS metadata server (which the node's network namespace
  reaches at 169.254.169.254) -> a worker container, wired to the agent's socket by the
  scheduler's webhook, hears it on its watch; each round at a random phase against the agent's
  1 s poll, then withdrawn (the worker hears that too) before the next. The same figure for the
  agent as a host process is ``bench/agent_latency.py --providers aws``.

    .venv/bin/python bench/realnode_notice.py [--installs 3] [--rounds 20]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from kubernetes import client, config

from devcluster import build, cluster, realnode, tools
from fakes.metadata import Threaded
from fakes.node_metadata import HostAwsMetadata
from tests.integration.realnode.conftest import AGENT_IMAGE, NODE, options, skip_reason
from tests.integration.realnode.test_chart import helm_install, settled
from tests.waiting import eventually

#: Appends each notice message the worker's watch gets to /host/log (one JSON line each).
WORKER = """
import asyncio, json, os, time
from nodeagent.client import NoticeClient
async def main():
    async for notice in NoticeClient.from_env().watch():
        with open("/host/log", "a") as f:
            f.write(json.dumps({"at": time.time(), "leave": notice.leave}) + "\\n")
asyncio.run(main())
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def worker(folder: Path) -> dict[str, Any]:
    return {
        "metadata": {"name": "bench-worker"},
        "spec": {
            "schedulerName": "shoal-scheduler",
            "securityContext": {
                "runAsUser": 1000,
                "runAsGroup": 1000,
                "supplementalGroups": [65532],
            },
            "containers": [
                {
                    "name": "worker",
                    "image": AGENT_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", WORKER],
                    "volumeMounts": [{"name": "host", "mountPath": "/host"}],
                }
            ],
            "volumes": [{"name": "host", "hostPath": {"path": str(folder), "type": "Directory"}}],
        },
    }


def lines(folder: Path) -> list[dict[str, Any]]:
    path = folder / "log"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def first_after(folder: Path, seen: int, *, leave: bool) -> dict[str, Any] | None:
    """The first message after the first ``seen`` whose ``leave`` is ``leave``."""
    return next((x for x in lines(folder)[seen:] if x["leave"] is leave), None)


def one_cluster(work: Path, bin_dir: Path, *, rounds: int) -> tuple[float, list[float]]:
    """Up, install (timed), then ``rounds`` notices (timed) when asked; down."""
    run_dir = work / f"cluster-{time.monotonic_ns()}"
    handle = cluster.up(run_dir, bin_dir, options())
    fakes = Threaded()
    try:
        aws = fakes.start(HostAwsMetadata(realnode.network_for(run_dir).host_ip))
        realnode.route(handle.real_node(NODE), realnode.METADATA_IP, 80, f"{aws.host}:{aws.port}")
        started = time.monotonic()
        done = helm_install(tools.ensure("helm"), str(handle.kubeconfig))
        installed = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(done.stderr)
        heard: list[float] = []
        if rounds:
            api = config.new_client_from_config(config_file=str(handle.kubeconfig))
            core = client.CoreV1Api(api)
            settled(core)
            folder = work / f"worker-{time.monotonic_ns()}"
            folder.mkdir(mode=0o777)
            folder.chmod(0o777)
            core.create_namespaced_pod("default", worker(folder))
            eventually(lambda: len(lines(folder)) >= 1, timeout=120, what="the worker watching")
            for _ in range(rounds):
                time.sleep(random.uniform(0.5, 1.5))  # noqa: S311 - a random phase against the poll
                seen = len(lines(folder))
                deadline = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 240))
                posted = time.time()
                fakes.call(
                    partial(
                        setattr, aws, "instance_action", {"action": "terminate", "time": deadline}
                    )
                )
                told = eventually(
                    partial(first_after, folder, seen, leave=True),
                    timeout=30,
                    what="the worker to hear the notice",
                )
                heard.append(told["at"] - posted)
                seen = len(lines(folder))
                fakes.call(lambda: setattr(aws, "instance_action", None))
                eventually(
                    partial(first_after, folder, seen, leave=False),
                    timeout=60,
                    what="the worker to hear the notice withdrawn",
                )
            api.close()
        return installed, heard
    finally:
        fakes.close()
        cluster.down(run_dir)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--installs", type=int, default=3, help="fresh clusters to install on")
    p.add_argument("--rounds", type=int, default=20, help="notices on the last cluster")
    args = p.parse_args()
    reason = skip_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    bin_dir = build.build()
    installs: list[float] = []
    heard: list[float] = []
    with tempfile.TemporaryDirectory(prefix="shoal-bench-realnode-") as work:
        for index in range(args.installs):
            last = index == args.installs - 1
            took, got = one_cluster(Path(work), bin_dir, rounds=args.rounds if last else 0)
            installs.append(took)
            heard += got
            print(f"helm install -> every pod Ready: {took:.1f} s", flush=True)
    print(f"helm install -> Ready (s): {', '.join(f'{t:.1f}' for t in installs)}")
    if heard:
        ms = [h * 1000 for h in heard]
        print(
            f"notice -> worker container heard, {len(ms)} notices: "
            f"p50 {percentile(ms, 0.5):.0f} ms, p99 {percentile(ms, 0.99):.0f} ms, "
            f"max {max(ms):.0f} ms, mean {statistics.mean(ms):.0f} ms"
        )
    print(f"load average: {Path('/proc/loadavg').read_text().split()[:3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
