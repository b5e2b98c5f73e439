"""Side by side on one devcluster: Shoal, kube-scheduler with its own gang scheduling, a binder.

One invocation creates N kwok nodes (8 GPUs each, racks and zones, 30% spot) on a devcluster with
Kubernetes' workload scheduling APIs on (``GenericWorkload``, ``TopologyAwareWorkloadScheduling``,
``scheduling.k8s.io/v1beta1``), so kube-scheduler's default profile gang-schedules PodGroups.
For each workload, each scheduler in turn gets the very same objects in a fresh namespace: a
``scheduling.k8s.io`` PodGroup per gang (``schedulingPolicy.gang.minCount`` = its size) and pods
naming it in ``spec.schedulingGroup``; single pods are plain pods. The scheduler under test is
started and has listed everything before the objects are created, and is stopped (SIGSTOP) while
they are; each run waits first until every node is Ready and untainted (:class:`NodeHealth`);
the clock starts when the scheduler is resumed and ends at the last binding a watch sees:

- pods/s: pods bound / seconds from the resume to the last binding;
- gang time-to-bound p50/p99: per whole gang, its last member's binding minus the resume;
- CPU seconds (from the resume) and peak resident memory of the scheduler process;
- partial gangs: gangs with some but not all members bound, counted from the API server at the
  end of the run (0 for an all-or-nothing scheduler);
- the ratio Shoal / kube-scheduler and each one's share of the ceiling the trivial binder sets
  (``bench-binder``, a client-go program built with the devcluster: round-robin binds, no
  decisions, the same client QPS/burst, protobuf like kube-scheduler).

Workloads: ``pods`` — 10,000 single pods (100m CPU, no GPU); ``gangs8`` — 1,000 gangs of 8
one-GPU pods; ``gangs64`` — 100 gangs of 64 one-GPU pods. Every scheduler uses the same client
QPS and burst; ``--qps 0`` lifts the limit for all of them, so each one's own decision speed is
what is measured. Prints a table and writes JSON; it is a measurement, not a test.

    .venv/bin/python bench/compare.py --nodes 1000 --workload gangs8 --out bench-out
    .venv/bin/python bench/compare.py --nodes 1000 --qps 0

``SHOAL_BENCH_WRAP`` prefixes Shoal's command line, to profile it in place, e.g.
``SHOAL_BENCH_WRAP="py-spy record --nonblocking -r 50 -f raw -o shoal.raw --"``; the bench
stops and times the wrapper's one child, the scheduler itself.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.watch.watch import iter_resp_lines

from contracts import names
from devcluster import build, cluster, nodes, process
from devcluster.ports import free_port

WORKLOADS = {
    # name: (gangs, members, gpus per pod)
    "pods": (10_000, 1, 0),
    "gangs8": (1_000, 8, 1),
    "gangs64": (100, 64, 1),
}
TOLERATION = {"key": names.KWOK_TAINT, "operator": "Exists", "effect": "NoSchedule"}
PODGROUPS = ("scheduling.k8s.io", "v1beta1", "podgroups")
SCHEDULER_NAMES = {
    "shoal": "shoal-bench",
    "kube-scheduler": "default-scheduler",
    "binder": "bench-binder",
}
#: client-go and Shoal: a QPS <= 0 means no rate limiter; kube-scheduler's configuration
#: defaults 0 to 50, so it gets -1 and the others 0.
LIFTED_BURST = 1_000_000


def pod_body(scheduler: str, gang: str, index: int, *, members: int, gpus: int) -> dict[str, Any]:
    limits = {"cpu": "100m", "memory": "128Mi"}
    if gpus:
        limits[names.GPU_RESOURCE] = str(gpus)
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "tolerations": [TOLERATION],
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {"name": "w", "image": "registry.example/trainer:1", "resources": {"limits": limits}}
        ],
    }
    if members > 1:
        spec["schedulingGroup"] = {"podGroupName": gang}
    return {"metadata": {"name": f"{gang}-{index}", "labels": {"bench/gang": gang}}, "spec": spec}


def pod_group_body(gang: str, members: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{PODGROUPS[0]}/{PODGROUPS[1]}",
        "kind": "PodGroup",
        "metadata": {"name": gang},
        "spec": {"schedulingPolicy": {"gang": {"minCount": members}}},
    }


def _watch_events(
    list_call: Callable[..., Any], version: str, **params: Any
) -> Generator[dict[str, Any], None, None]:
    """One watch from ``version`` (``list_call``: a client list method, ``params`` its own), as
    raw JSON events, until the API server ends it. Raw lines, because decoding each event into
    the client's model objects cost more CPU than some schedulers under test, and the watches
    share the machine with them."""
    response = list_call(
        **params,
        watch=True,
        resource_version=version,
        allow_watch_bookmarks=True,
        timeout_seconds=300,
        _preload_content=False,
    )
    try:
        for line in iter_resp_lines(response):
            yield json.loads(line)
    finally:
        response.release_conn()


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
        while not self.done.is_set():
            with closing(
                _watch_events(self._core.list_namespaced_pod, version, namespace=self._namespace)
            ) as events:
                for event in events:
                    pod = event["object"]
                    if event["type"] == "ERROR":  # 410 Gone and the like: the run times out
                        print(f"  watch of {self._namespace} ended: {pod}", flush=True)
                        return
                    version = pod["metadata"].get("resourceVersion", version)
                    name = pod["metadata"].get("name")
                    if event["type"] == "BOOKMARK" or name in self.bound_at:
                        continue
                    if pod.get("spec", {}).get("nodeName"):
                        self.bound_at[name] = time.monotonic()
                        if len(self.bound_at) == self._total:
                            self.done.set()
                            return


def _unusable(node: dict[str, Any]) -> bool:
    """Not Ready, or tainted by the node-lifecycle controller (any taint but kwok's own)."""
    ready = [c for c in node.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
    taints = node.get("spec", {}).get("taints") or []
    return (
        not ready
        or ready[0]["status"] != "True"
        or any(t["key"] != names.KWOK_TAINT for t in taints)
    )


class NodeHealth:
    """Which nodes no bench pod could use (not Ready, or tainted not-ready/unreachable), from a
    watch of the nodes.

    kwok makes a few dozen new nodes Ready a second, so 5,000 of them take minutes, and the
    node-lifecycle controller taints the rest ``not-ready`` meanwhile; a run timed then measures a
    cluster whose nodes change under the scheduler. Each run waits until every node is usable,
    and reports how many node updates arrived during it and the most nodes unusable at once."""

    def __init__(self, core: Any) -> None:
        self._core = core
        self._lock = threading.Condition()
        self._unusable: set[str] = set()
        self.updates = 0
        self.peak = 0
        self._closed = threading.Event()
        version = self._list()
        threading.Thread(target=self._run, args=(version,), daemon=True).start()

    def _list(self) -> str:
        raw = json.loads(self._core.list_node(_preload_content=False).data)
        with self._lock:
            self._unusable = {n["metadata"]["name"] for n in raw["items"] if _unusable(n)}
            self._lock.notify_all()
        return str(raw["metadata"]["resourceVersion"])

    def close(self) -> None:
        """Before the cluster goes down: the watch ending then is no news."""
        self._closed.set()

    def _run(self, version: str) -> None:
        while not self._closed.is_set():
            try:
                version = self._watch(version)
            except Exception as exc:  # the API server went away or cut the watch
                if self._closed.is_set():
                    return
                print(f"  node watch: {exc!r}; listing again", flush=True)
                time.sleep(1)
                version = self._list()

    def _watch(self, version: str) -> str:
        """Follow the nodes from ``version`` until the watch ends; the version reached."""
        while True:
            with closing(_watch_events(self._core.list_node, version)) as events:
                for event in events:
                    node = event["object"]
                    if event["type"] == "ERROR":  # 410 Gone: list again
                        return self._list()
                    version = node["metadata"].get("resourceVersion", version)
                    if event["type"] != "BOOKMARK":
                        self._seen(event["type"], node)

    def _seen(self, kind: str, node: dict[str, Any]) -> None:
        name = node["metadata"]["name"]
        with self._lock:
            self.updates += 1
            if kind != "DELETED" and _unusable(node):
                self._unusable.add(name)
            else:
                self._unusable.discard(name)
            self.peak = max(self.peak, len(self._unusable))
            self._lock.notify_all()

    def settle(self, timeout: float = 900) -> float:
        """Seconds waited until every node is usable."""
        started = time.monotonic()
        with self._lock:
            if not self._lock.wait_for(lambda: not self._unusable, timeout):
                left = len(self._unusable)
                raise SystemExit(f"{left} node(s) still unusable after {timeout:.0f} s")
        return time.monotonic() - started

    def count_from_now(self) -> None:
        """What :meth:`report` says starts again here."""
        with self._lock:
            self.updates, self.peak = 0, len(self._unusable)

    def report(self) -> dict[str, int]:
        with self._lock:
            return {"node_updates": self.updates, "nodes_unusable_max": self.peak}


def _wait_ready(url: str, what: str, timeout: float = 120) -> None:
    """Until ``url`` answers 200: the scheduler has listed the cluster (warm before the clock)."""
    tls = ssl.create_default_context()
    tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5, context=tls) as answer:  # noqa: S310 - loopback
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{what} was not ready at {url} within {timeout:.0f} s")


def _create(fn: Any, items: list[Any]) -> None:
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(fn, items))


def _shoal_argv(
    handle: cluster.Cluster, scheduler_name: str, port: int, args: argparse.Namespace
) -> list[str]:
    lifted = args.qps <= 0
    argv = [
        sys.executable,
        "-m",
        "scheduler",
        "--kubeconfig",
        str(handle.kubeconfig),
        "--scheduler-name",
        scheduler_name,
        "--http-port",
        str(port),
        "--log-format",
        "json",
        "--qps",
        "0" if lifted else str(args.qps),
        "--burst",
        str(LIFTED_BURST if lifted else args.burst),
    ]
    if os.environ.get("SHOAL_BENCH_WRAP"):
        argv = [*os.environ["SHOAL_BENCH_WRAP"].split(), *argv]
    return argv


def _scheduler_pid(pid: int) -> int:
    """The scheduler's own pid: under ``SHOAL_BENCH_WRAP`` the started process is the wrapper
    (a profiler), and stopping or timing that one instead would freeze or miss the scheduler."""
    if not os.environ.get("SHOAL_BENCH_WRAP"):
        return pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    if len(children) != 1:
        raise SystemExit(f"SHOAL_BENCH_WRAP: expected one child of the wrapper, got {children}")
    return int(children[0])


def run_one(  # noqa: C901, PLR0915 - one benchmark run as one script: start, load, measure, clean up
    kind: str,
    *,
    handle: cluster.Cluster,
    api: Any,
    workload: str,
    args: argparse.Namespace,
    work: Path,
    health: NodeHealth,
) -> dict[str, Any]:
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    waited = health.settle()
    if waited > 1:
        print(f"  waited {waited:.0f} s for every node to be Ready and untainted", flush=True)
    gangs, members, gpus = WORKLOADS[workload]
    gangs = max(1, round(gangs * args.scale))
    total = gangs * members
    namespace = f"bench-{kind}"
    scheduler_name = SCHEDULER_NAMES[kind]
    lifted = args.qps <= 0
    core.create_namespace({"metadata": {"name": namespace}})
    log = (work / f"{kind}-{workload}.log").open("wb")
    proc: subprocess.Popen[bytes] | None = None
    pid = 0
    if kind == "kube-scheduler":
        pid = next(p.pid for p in handle.procs if p.name == "kube-scheduler")
        _wait_ready(f"https://127.0.0.1:{handle.ports['scheduler']}/readyz", kind)
    elif kind == "shoal":
        port = free_port()
        argv = _shoal_argv(handle, scheduler_name, port, args)
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        _wait_ready(f"http://127.0.0.1:{port}/readyz", kind)
        pid = _scheduler_pid(proc.pid)
    if pid:
        os.kill(pid, signal.SIGSTOP)  # every object in place before it decides anything
    started = time.monotonic()
    if members > 1:
        _create(
            lambda g: custom.create_namespaced_custom_object(
                *PODGROUPS[:2], namespace, PODGROUPS[2], pod_group_body(f"g{g:05d}", members)
            ),
            list(range(gangs)),
        )
    bodies = [
        pod_body(scheduler_name, f"g{g:05d}", i, members=members, gpus=gpus)
        for g in range(gangs)
        for i in range(members)
    ]
    _create(lambda b: core.create_namespaced_pod(namespace, b), bodies)
    print(
        f"  {kind}: {total} pending pods ({gangs if members > 1 else 0} PodGroups) created in "
        f"{time.monotonic() - started:.0f} s",
        flush=True,
    )
    watcher = Watcher(core, namespace, total)
    health.settle()
    health.count_from_now()
    t0 = time.monotonic()
    if pid:
        cpu0 = process.cpu_seconds(pid)
        os.kill(pid, signal.SIGCONT)
    else:
        proc = subprocess.Popen(
            [
                str(args.bin_dir / "bench-binder"),
                "--kubeconfig",
                str(handle.kubeconfig),
                "--namespace",
                namespace,
                "--qps",
                "0" if lifted else str(args.qps),
                "--burst",
                str(LIFTED_BURST if lifted else args.burst),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        pid, cpu0 = proc.pid, 0.0
    finished = watcher.done.wait(args.timeout)
    t_end = time.monotonic()
    nodes_seen = health.report()
    # Peak memory from /proc (VmHWM starts again at exec; wait4's ru_maxrss would count the
    # forked copy of this Python process); None for a binder that already exited.
    hwm = process.status_kib(pid, "VmHWM")
    rss = None if hwm is None else hwm / 1024
    if kind != "binder":
        cpu = process.cpu_seconds(pid) - cpu0
    if proc is not None:
        # The scheduler itself (a wrapper then exits with it, writing its profile); a zombie
        # until reaped below, never reused.
        os.kill(pid, signal.SIGTERM)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if kind == "binder":  # it may have exited already: its own accounting
            cpu = usage.ru_utime + usage.ru_stime
    log.close()
    # What the API server holds at the end, not what the watch saw: bound members per gang.
    raw = core.list_namespaced_pod(namespace, _preload_content=False)
    items = json.loads(raw.data)["items"]
    bound_members = Counter(
        i["metadata"]["labels"]["bench/gang"] for i in items if i["spec"].get("nodeName")
    )
    partial = sum(1 for n in bound_members.values() if 0 < n < members)
    bound = watcher.bound_at
    last = max(bound.values(), default=t0)
    by_gang: dict[str, list[float]] = {}
    for name, when in bound.items():
        by_gang.setdefault(name.rsplit("-", 1)[0], []).append(when - t0)
    complete = sorted(max(v) for v in by_gang.values() if len(v) == members) if members > 1 else []
    result = {
        "scheduler": kind,
        "workload": workload,
        "nodes": args.nodes,
        "qps": "lifted" if lifted else args.qps,
        "pods": total,
        "bound": len(bound),
        "finished": finished,
        "partial_gangs": partial if members > 1 else None,
        "seconds": round(last - t0, 2),
        "wall_seconds": round(t_end - t0, 2),
        "pods_per_s": round(len(bound) / (last - t0), 1) if last > t0 else 0.0,
        "gang_bound_p50_s": _pct(complete, 50),
        "gang_bound_p99_s": _pct(complete, 99),
        "cpu_seconds": round(cpu, 1),
        "peak_rss_mib": None if rss is None else round(rss, 1),
        **nodes_seen,
    }
    _clean(core, namespace, [i["metadata"]["name"] for i in items])
    if kind == "kube-scheduler":
        cluster.restart(handle, "kube-scheduler", say=lambda _m: None)
    return result


def _clean(core: Any, namespace: str, pods: list[str]) -> None:
    """Pods first, with no grace: the API server drops them at once instead of waiting for kwok
    to report each one terminated (minutes at 5,000 nodes), and the next run starts clean. The
    PodGroups go with the namespace once their pods are gone (the protection controller)."""

    def drop(name: str) -> None:
        try:
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        except client.exceptions.ApiException as exc:
            if exc.status != 404:
                raise

    _create(drop, pods)  # one deletecollection times out (504)
    core.delete_namespace(namespace)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            core.read_namespace(namespace)
        except client.exceptions.ApiException as exc:
            if exc.status == 404:
                break
        time.sleep(2)


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, max(0, int(len(values) * p / 100 + 0.5) - 1))], 2)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--workload", choices=sorted(WORKLOADS), action="append")
    p.add_argument("--schedulers", default="binder,kube-scheduler,shoal")
    p.add_argument("--qps", type=float, default=200, help="client QPS of every scheduler (0: none)")
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
    lifted = args.qps <= 0
    handle = cluster.up(
        work / "run",
        args.bin_dir,
        cluster.Options(
            die_with_parent=True,
            kube_scheduler="kube-scheduler" in kinds,
            scheduler_qps=-1 if lifted else int(args.qps),
            scheduler_burst=LIFTED_BURST if lifted else args.burst,
            feature_gates=cluster.WORKLOAD_GATES,
            runtime_config=cluster.WORKLOAD_RUNTIME_CONFIG,
            # kwok renews every node's lease from this same busy machine: late renewals must
            # not turn nodes unreachable mid-run (see NodeHealth).
            node_monitor_grace_period="10m",
        ),
    )
    results = []
    health: NodeHealth | None = None
    try:
        api = config.new_client_from_config(config_file=str(handle.kubeconfig))
        api.configuration.connection_pool_maxsize = 32
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
        health = NodeHealth(client.CoreV1Api(api))
        for workload in workloads:
            print(f"workload {workload}:", flush=True)
            for kind in kinds:
                result = run_one(
                    kind,
                    handle=handle,
                    api=api,
                    workload=workload,
                    args=args,
                    work=work,
                    health=health,
                )
                results.append(result)
                print(f"  {json.dumps(result)}", flush=True)
    finally:
        if health is not None:
            health.close()
        cluster.down(work / "run", say=lambda _m: None)
    name = f"compare-{args.nodes}-{'lifted' if lifted else f'qps{args.qps:g}'}.json"
    out = args.out / name
    out.write_text(
        json.dumps({"qps": args.qps, "burst": args.burst, "results": results}, indent=2) + "\n"
    )
    print(table(results))
    print(f"results: {out}; logs: {work}")
    return 0 if all(r["finished"] and not r["partial_gangs"] for r in results) else 1


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| nodes | QPS | workload | scheduler | pods/s | gang p50 / p99 s | partial gangs | CPU s |"
        " peak MiB | vs kube-scheduler | share of ceiling |",
        "|" + "---|" * 11,
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
        partial = "-" if r["partial_gangs"] is None else str(r["partial_gangs"])
        if not r["finished"]:
            partial += f" (unfinished: {r['bound']}/{r['pods']} bound)"
        lines.append(
            f"| {r['nodes']} | {r['qps']} | {r['workload']} | {r['scheduler']} |"
            f" {r['pods_per_s']} | {gang} | {partial} | {r['cpu_seconds']} |"
            f" {r['peak_rss_mib'] or '-'} | {ratio} | {share} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
