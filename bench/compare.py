"""Side by side on one devcluster: Shoal, the stock kube-scheduler, and a trivial binder.

One invocation creates N kwok nodes (8 GPUs each, racks and zones, 30% spot), then for each
scheduler in turn creates the same workload in a fresh namespace while that scheduler is not
running, starts (or resumes) it, and measures until every pod is bound:

- pods/s: pods bound / seconds from the scheduler's start to the last binding, as seen by a
  watch on the API server;
- gang time-to-bound p50/p99: per gang, its last member's binding minus the scheduler's start;
- CPU seconds and peak resident memory of the scheduler process;
- the ratio Shoal / kube-scheduler and each one's share of the ceiling the trivial binder sets
  (``bench-binder``, a client-go program built with the devcluster: round-robin binds, no
  decisions, the same client QPS/burst, protobuf like kube-scheduler).

Workloads: ``pods`` — 10,000 single pods (100m CPU, no GPU); ``gangs8`` — 1,000 gangs of 8
one-GPU pods; ``gangs64`` — 100 gangs of 64 one-GPU pods. The stock scheduler has no gang
semantics, so it gets the same pods as plain pods. Every scheduler uses the same client QPS and
burst. Prints a table and writes JSON; it is a measurement, not a test.

    .venv/bin/python bench/compare.py --nodes 1000 --workload gangs8 --out bench-out

``SHOAL_BENCH_WRAP`` prefixes Shoal's command line, to profile it in place, e.g.
``SHOAL_BENCH_WRAP="py-spy record -r 50 -f raw -o shoal.raw --duration 35 --"``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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
from devcluster import build, cluster, nodes, process

WORKLOADS = {
    # name: (gangs, members, gpus per pod)
    "pods": (10_000, 1, 0),
    "gangs8": (1_000, 8, 1),
    "gangs64": (100, 64, 1),
}
TOLERATION = {"key": names.KWOK_TAINT, "operator": "Exists", "effect": "NoSchedule"}


def pod_body(
    scheduler: str, gang: str, index: int, *, members: int, gpus: int, gang_labels: bool
) -> dict[str, Any]:
    limits = {"cpu": "100m", "memory": "128Mi"}
    if gpus:
        limits[names.GPU_RESOURCE] = str(gpus)
    metadata: dict[str, Any] = {"name": f"{gang}-{index}", "labels": {"bench/gang": gang}}
    if gang_labels and members > 1:
        metadata["labels"][names.GANG_LABEL] = gang
        metadata["annotations"] = {names.MIN_MEMBER_ANNOTATION: str(members)}
    return {
        "metadata": metadata,
        "spec": {
            "schedulerName": scheduler,
            "tolerations": [TOLERATION],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "w",
                    "image": "registry.example/trainer:1",
                    "resources": {"limits": limits},
                }
            ],
        },
    }


class Watcher:
    """Records when each pod of a namespace is first seen bound."""

    def __init__(self, core: Any, namespace: str, total: int) -> None:
        self.bound_at: dict[str, float] = {}
        self.done = threading.Event()
        self._core, self._namespace, self._total = core, namespace, total
        version = core.list_namespaced_pod(namespace, limit=1).metadata.resource_version
        self._thread = threading.Thread(target=self._run, args=(version,), daemon=True)
        self._thread.start()

    def _run(self, version: str) -> None:
        w = watch.Watch()
        for event in w.stream(
            self._core.list_namespaced_pod,
            self._namespace,
            resource_version=version,
            timeout_seconds=3600,
        ):
            pod = event["object"]
            if pod.spec.node_name and pod.metadata.name not in self.bound_at:
                self.bound_at[pod.metadata.name] = time.monotonic()
                if len(self.bound_at) == self._total:
                    self.done.set()
                    w.stop()


def run_one(  # noqa: C901, PLR0915 - one benchmark run as one script: start, load, measure, clean up
    kind: str,
    *,
    handle: cluster.Cluster,
    core: Any,
    workload: str,
    args: argparse.Namespace,
    work: Path,
) -> dict[str, Any]:
    gangs, members, gpus = WORKLOADS[workload]
    gangs = max(1, round(gangs * args.scale))
    total = gangs * members
    namespace = f"bench-{kind}"
    scheduler_name = {
        "shoal": "shoal-bench",
        "kube-scheduler": "default-scheduler",
        "binder": "bench-binder",
    }[kind]
    core.create_namespace({"metadata": {"name": namespace}})
    kube_pid = next((p.pid for p in handle.procs if p.name == "kube-scheduler"), None)
    if kind == "kube-scheduler":
        assert kube_pid is not None
        os.kill(kube_pid, signal.SIGSTOP)  # every pod pending before it starts, as for the others
    bodies = [
        pod_body(
            scheduler_name, f"g{g:05d}", i, members=members, gpus=gpus, gang_labels=kind == "shoal"
        )
        for g in range(gangs)
        for i in range(members)
    ]
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda b: core.create_namespaced_pod(namespace, b), bodies))
    print(
        f"  {kind}: {total} pending pods created in {time.monotonic() - started:.0f} s", flush=True
    )
    watcher = Watcher(core, namespace, total)
    log = (work / f"{kind}-{workload}.log").open("wb")
    proc: subprocess.Popen[bytes] | None = None
    t0 = time.monotonic()
    if kind == "kube-scheduler":
        assert kube_pid is not None
        pid = kube_pid
        cpu0 = process.cpu_seconds(pid)
        os.kill(pid, signal.SIGCONT)
    else:
        argv = (
            [
                sys.executable,
                "-m",
                "scheduler",
                "--kubeconfig",
                str(handle.kubeconfig),
                "--scheduler-name",
                scheduler_name,
                "--http-port",
                "0",
                "--log-format",
                "json",
                "--qps",
                str(args.qps),
                "--burst",
                str(args.burst),
            ]
            if kind == "shoal"
            else [
                str(args.bin_dir / "bench-binder"),
                "--kubeconfig",
                str(handle.kubeconfig),
                "--namespace",
                namespace,
                "--qps",
                str(args.qps),
                "--burst",
                str(args.burst),
            ]
        )
        if kind == "shoal" and os.environ.get("SHOAL_BENCH_WRAP"):
            # e.g. "py-spy record -r 100 -f speedscope -o shoal.json --" to profile the run.
            argv = [*os.environ["SHOAL_BENCH_WRAP"].split(), *argv]
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        pid = proc.pid
        cpu0 = 0.0
    finished = watcher.done.wait(args.timeout)
    t_end = time.monotonic()
    if proc is None:
        cpu = process.cpu_seconds(pid) - cpu0
        rss = (process.status_kib(pid, "VmHWM") or 0) / 1024
    else:
        # The process's own accounting, also right for one that already exited (bench-binder).
        os.kill(proc.pid, signal.SIGTERM)  # a zombie until reaped below, never reused
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        cpu = usage.ru_utime + usage.ru_stime
        rss = usage.ru_maxrss / 1024
    log.close()
    bound = watcher.bound_at
    last = max(bound.values(), default=t0)
    by_gang: dict[str, float] = {}
    for name, when in bound.items():
        gang = name.rsplit("-", 1)[0]
        by_gang[gang] = max(by_gang.get(gang, 0.0), when - t0)
    complete = (
        sorted(
            v
            for g, v in by_gang.items()
            if sum(1 for n in bound if n.rsplit("-", 1)[0] == g) == members
        )
        if members > 1
        else []
    )
    result = {
        "scheduler": kind,
        "workload": workload,
        "nodes": args.nodes,
        "pods": total,
        "bound": len(bound),
        "finished": finished,
        "seconds": round(last - t0, 2),
        "wall_seconds": round(t_end - t0, 2),
        "pods_per_s": round(len(bound) / (last - t0), 1) if last > t0 else 0.0,
        "gang_bound_p50_s": _pct(complete, 50),
        "gang_bound_p99_s": _pct(complete, 99),
        "cpu_seconds": round(cpu, 1),
        "peak_rss_mib": round(rss, 1),
    }
    # Pods first, with no grace: the API server drops them at once instead of waiting for kwok
    # to report each one terminated (minutes at 5,000 nodes), and the next run starts clean.
    raw = core.list_namespaced_pod(namespace, _preload_content=False)
    leftover = [item["metadata"]["name"] for item in json.loads(raw.data)["items"]]

    def drop(name: str) -> None:
        try:
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        except client.exceptions.ApiException as exc:
            if exc.status != 404:
                raise

    with ThreadPoolExecutor(max_workers=16) as pool:  # one deletecollection times out (504)
        list(pool.map(drop, leftover))
    core.delete_namespace(namespace)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            core.read_namespace(namespace)
        except client.exceptions.ApiException as exc:
            if exc.status == 404:
                break
        time.sleep(2)
    if kind == "kube-scheduler":
        cluster.restart(handle, "kube-scheduler", say=lambda _m: None)
    return result


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, max(0, int(len(values) * p / 100 + 0.5) - 1))], 2)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--workload", choices=sorted(WORKLOADS), action="append")
    p.add_argument("--schedulers", default="binder,kube-scheduler,shoal")
    p.add_argument("--qps", type=float, default=200)
    p.add_argument("--burst", type=int, default=400)
    p.add_argument("--timeout", type=float, default=1200)
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    p.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply each workload's gang count (a quick check: 0.05)",
    )
    args = p.parse_args()
    workloads = args.workload or sorted(WORKLOADS)
    kinds = [k.strip() for k in args.schedulers.split(",") if k.strip()]
    work = Path(tempfile.mkdtemp(prefix="shoal-compare-"))
    args.out.mkdir(parents=True, exist_ok=True)
    args.bin_dir = build.build()
    handle = cluster.up(
        work / "run",
        args.bin_dir,
        cluster.Options(
            die_with_parent=True,
            kube_scheduler="kube-scheduler" in kinds,
            scheduler_qps=int(args.qps),
            scheduler_burst=args.burst,
        ),
    )
    results = []
    try:
        api = config.new_client_from_config(config_file=str(handle.kubeconfig))
        api.configuration.connection_pool_maxsize = 32
        core = client.CoreV1Api(api)
        started = time.monotonic()
        nodes.create(
            str(handle.kubeconfig),
            nodes.NodeSpec(
                count=args.nodes,
                gpus=8,
                prefix="bench",
                zones=2,
                racks_per_zone=max(1, args.nodes // 40),
                spot_fraction=0.3,
            ),
            workers=16,
        )
        print(f"{args.nodes} nodes in {time.monotonic() - started:.0f} s", flush=True)
        for workload in workloads:
            print(f"workload {workload}:", flush=True)
            for kind in kinds:
                result = run_one(
                    kind, handle=handle, core=core, workload=workload, args=args, work=work
                )
                results.append(result)
                print(f"  {json.dumps(result)}", flush=True)
    finally:
        cluster.down(work / "run", say=lambda _m: None)
    out = args.out / f"compare-{args.nodes}.json"
    out.write_text(
        json.dumps({"qps": args.qps, "burst": args.burst, "results": results}, indent=2) + "\n"
    )
    print(table(results))
    print(f"results: {out}; logs: {work}")
    return 0 if all(r["finished"] for r in results) else 1


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| nodes | workload | scheduler | pods/s | gang p50 / p99 s | CPU s | peak MiB |"
        " vs kube-scheduler | share of ceiling |",
        "|" + "---|" * 9,
    ]
    index = {(r["workload"], r["scheduler"]): r for r in results}
    for r in results:
        kube = index.get((r["workload"], "kube-scheduler"))
        ceiling = index.get((r["workload"], "binder"))
        ratio = (
            f"{r['pods_per_s'] / kube['pods_per_s']:.2f}x" if kube and kube["pods_per_s"] else "-"
        )
        share = (
            f"{r['pods_per_s'] / ceiling['pods_per_s']:.0%}"
            if ceiling and ceiling["pods_per_s"]
            else "-"
        )
        gang = (
            f"{r['gang_bound_p50_s']} / {r['gang_bound_p99_s']}"
            if r["gang_bound_p50_s"] is not None
            else "-"
        )
        lines.append(
            f"| {r['nodes']} | {r['workload']} | {r['scheduler']} | {r['pods_per_s']} | "
            f"{gang} | {r['cpu_seconds']} | {r['peak_rss_mib']} | {ratio} | {share} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
