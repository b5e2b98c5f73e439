"""Benchmark: gang decision latency and pods/s of the Shoal scheduler on 1,000 kwok nodes.

Starts its own devcluster (in a temporary folder), creates the nodes, creates every gang's pods
while no scheduler runs, then starts ``python -m scheduler`` and measures:

- pods/s: pods bound / seconds from the scheduler's first cycle to the last pod bound (as seen
  by a watch on the API server, so bindings are counted when they are real);
- gang decision latency: the placement search per gang (p50 / p99 / max, from the scheduler's
  per-cycle log line), and the whole cycle (snapshot + gangs + decision);
- gangs bound whole, and that none is partially bound at the end.

This is a measurement, not a test: it prints figures and exits 0 unless something broke.

    .venv/bin/python bench/scheduler_1000_nodes.py [--nodes 1000 --gangs 200 --gang-size 8
        --gpus-per-pod 4 --qps 200 --burst 400]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from contracts import names
from devcluster import build, cluster, nodes

NAMESPACE = "bench"
SCHEDULER = "shoal-bench"
TOLERATION = {
    "key": names.KWOK_TAINT,
    "operator": "Equal",
    "value": names.KWOK_NODE_VALUE,
    "effect": "NoSchedule",
}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def pod_body(gang: str, index: int, gpus: int, minimum: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{gang}-{index}",
            "labels": {names.GANG_LABEL: gang},
            "annotations": {names.MIN_MEMBER_ANNOTATION: str(minimum)},
        },
        "spec": {
            "schedulerName": SCHEDULER,
            "tolerations": [TOLERATION],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "worker",
                    "image": "registry.example/trainer:1",
                    "resources": {"limits": {names.GPU_RESOURCE: str(gpus), "cpu": "2"}},
                }
            ],
        },
    }


def main() -> int:  # noqa: C901, PLR0915 - the benchmark as one script, step by step
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--gangs", type=int, default=200)
    p.add_argument("--gang-size", type=int, default=8)
    p.add_argument("--gpus-per-pod", type=int, default=4)
    p.add_argument("--qps", type=float, default=200)
    p.add_argument("--burst", type=int, default=400)
    p.add_argument("--bind-workers", type=int, default=64)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument(
        "--kube-scheduler",
        action="store_true",
        help="afterwards, time the stock kube-scheduler (client QPS 50 / burst 100 by default) "
        "on the same number of plain pods of the same size on the same cluster",
    )
    args = p.parse_args()

    bin_dir = build.build()
    work = Path(tempfile.mkdtemp(prefix="shoal-bench-"))
    print(f"bench: devcluster in {work}", flush=True)
    handle = cluster.up(
        work / "run",
        bin_dir,
        cluster.Options(die_with_parent=True, kube_scheduler=args.kube_scheduler),
    )
    scheduler: subprocess.Popen[bytes] | None = None
    try:
        kubeconfig = str(handle.kubeconfig)
        api = config.new_client_from_config(config_file=kubeconfig)
        api.configuration.connection_pool_maxsize = 32
        core = client.CoreV1Api(api)
        started = time.monotonic()
        spec = nodes.NodeSpec(
            count=args.nodes, gpus=8, prefix="bench", zones=2, racks_per_zone=25, spot_fraction=0.3
        )
        nodes.create(kubeconfig, spec, workers=16)
        print(f"bench: {args.nodes} nodes in {time.monotonic() - started:.1f} s", flush=True)

        core.create_namespace({"metadata": {"name": NAMESPACE}})
        bodies = [
            pod_body(f"g{g:04d}", i, args.gpus_per_pod, args.gang_size)
            for g in range(args.gangs)
            for i in range(args.gang_size)
        ]
        total = len(bodies)
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(lambda b: core.create_namespaced_pod(NAMESPACE, b), bodies))
        print(f"bench: {total} pending pods in {time.monotonic() - started:.1f} s", flush=True)

        bound_at: dict[str, float] = {}
        done = threading.Event()
        listing = core.list_namespaced_pod(NAMESPACE)
        version = listing.metadata.resource_version

        def observe() -> None:
            w = watch.Watch()
            for event in w.stream(core.list_namespaced_pod, NAMESPACE, resource_version=version):
                pod = event["object"]
                if pod.spec.node_name and pod.metadata.name not in bound_at:
                    bound_at[pod.metadata.name] = time.monotonic()
                    if len(bound_at) == total:
                        done.set()
                        w.stop()

        watcher = threading.Thread(target=observe, daemon=True)
        watcher.start()

        log_path = work / "scheduler.log"
        t0 = time.monotonic()
        with log_path.open("wb") as log:
            scheduler = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "scheduler",
                    "--kubeconfig",
                    kubeconfig,
                    "--scheduler-name",
                    SCHEDULER,
                    "--http-port",
                    "0",
                    "--log-format",
                    "json",
                    "--qps",
                    str(args.qps),
                    "--burst",
                    str(args.burst),
                    "--bind-workers",
                    str(args.bind_workers),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        finished = done.wait(args.timeout)
        t_end = time.monotonic()
        scheduler.terminate()
        scheduler.wait(timeout=60)

        cycles = []
        first_cycle_at = None
        for line in log_path.read_text().splitlines():
            if line.startswith("{"):
                doc = json.loads(line)
                if doc.get("event") == "cycle":
                    cycles.append(doc)
        decide = [c["decide_ms"] for c in cycles if c.get("placed_min")]
        cycle = [c["cycle_ms"] for c in cycles if c.get("placed_min")]
        if bound_at:
            first_cycle_at = min(bound_at.values())
        by_gang: dict[str, int] = {}
        for name in bound_at:
            gang = name.rsplit("-", 1)[0]
            by_gang[gang] = by_gang.get(gang, 0) + 1
        partial = [g for g, n in by_gang.items() if n % args.gang_size]
        span = (max(bound_at.values()) - first_cycle_at) if bound_at and first_cycle_at else 0.0

        print()
        print(
            f"nodes={args.nodes} gangs={args.gangs} gang_size={args.gang_size} "
            f"gpus_per_pod={args.gpus_per_pod} pods={total} qps={args.qps} burst={args.burst} "
            f"bind_workers={args.bind_workers}"
        )
        print(
            f"bound: {len(bound_at)}/{total} pods, {len(by_gang)} gangs, partial gangs: "
            f"{len(partial)}{' (timed out)' if not finished else ''}"
        )
        print(f"startup to first binding: {first_cycle_at - t0 if first_cycle_at else 0:.2f} s")
        if span > 0:
            print(
                f"throughput: {len(bound_at) / span:.0f} pods/s over {span:.2f} s "
                f"(first to last binding)"
            )
        print(
            f"end to end: {len(bound_at) / (t_end - t0):.0f} pods/s over {t_end - t0:.2f} s "
            "(scheduler start to last binding, including its start-up and initial list)"
        )
        if decide:
            print(
                f"gang decision (placement search): p50 {statistics.median(decide):.1f} ms, "
                f"p99 {percentile(decide, 0.99):.1f} ms, max {max(decide):.1f} ms "
                f"over {len(decide)} gangs"
            )
            print(
                f"whole cycle (snapshot + gangs + decision): p50 {statistics.median(cycle):.1f} "
                f"ms, p99 {percentile(cycle, 0.99):.1f} ms"
            )
        ok = finished and not partial
        if args.kube_scheduler:
            core.delete_namespace(NAMESPACE)
            pid = next(proc.pid for proc in handle.procs if proc.name == "kube-scheduler")
            ok = _kube_scheduler(core, total, args, pid) and ok
        return 0 if ok else 1
    finally:
        if scheduler is not None and scheduler.poll() is None:
            scheduler.kill()
        cluster.down(work / "run")


def _kube_scheduler(core: Any, total: int, args: argparse.Namespace, pid: int) -> bool:
    """The stock scheduler on ``total`` plain pods of the same size (no gangs), created while
    it is paused (SIGSTOP) so that, as for Shoal, every pod is pending when it starts."""
    namespace = "bench-kube-scheduler"
    core.create_namespace({"metadata": {"name": namespace}})
    bound_at: dict[str, float] = {}
    done = threading.Event()
    version = core.list_namespaced_pod(namespace).metadata.resource_version

    def observe() -> None:
        w = watch.Watch()
        for event in w.stream(core.list_namespaced_pod, namespace, resource_version=version):
            pod = event["object"]
            if pod.spec.node_name and pod.metadata.name not in bound_at:
                bound_at[pod.metadata.name] = time.monotonic()
                if len(bound_at) == total:
                    done.set()
                    w.stop()

    threading.Thread(target=observe, daemon=True).start()
    bodies = []
    for i in range(total):
        body = pod_body("plain", i, args.gpus_per_pod, 1)
        body["metadata"]["labels"] = {}
        body["metadata"]["annotations"] = {}
        body["spec"]["schedulerName"] = "default-scheduler"
        bodies.append(body)
    os.kill(pid, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(lambda b: core.create_namespaced_pod(namespace, b), bodies))
    finally:
        os.kill(pid, signal.SIGCONT)
    t0 = time.monotonic()
    finished = done.wait(args.timeout)
    span = max(bound_at.values()) - min(bound_at.values()) if len(bound_at) > 1 else 0.0
    print()
    print(f"kube-scheduler: bound {len(bound_at)}/{total} plain pods")
    if span > 0:
        print(
            f"kube-scheduler throughput: {len(bound_at) / span:.0f} pods/s over {span:.2f} s "
            "(first to last binding)"
        )
        print(f"kube-scheduler end to end: {len(bound_at) / (time.monotonic() - t0):.0f} pods/s")
    return finished


if __name__ == "__main__":
    sys.exit(main())
