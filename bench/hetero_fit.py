"""Fit on a heterogeneous GPU cluster: the Alibaba GPU trace (cluster-trace-gpu-v2023) replayed
the way the FGD paper (Weng et al., USENIX ATC '23) replays it, through the live placement
search, under Shoal's scores, GPU best-fit and least-allocated.

The cluster is ``openb_node_list_all_node.csv`` (1,523 nodes of 8 GPU and CPU-only shapes, 6,212
GPUs). Pods are the rows of one ``openb_pod_list_*.csv`` (a workload mix), taken in a seeded
random order (the list shuffled again each time it runs out) and placed one at a time, never
leaving, until the GPUs asked for reach ``--demand`` (130%) of the cluster's GPUs. Each pod asks
for its CPU, memory and ``num_gpu`` whole GPUs (``gpu_milli`` and ``gpu_spec`` are not used:
Shoal places whole GPUs and no GPU-model constraint). Reported per policy: the share of GPUs
allocated when demand reaches 100% and 130% of capacity; of the 8-GPU pods (the largest) that
arrived before demand reached 100%, the share turned away; and the placement's cost per pod
(process time of ``place``, median and p99).

``--gangs`` replays gangs instead: the trace's 8-GPU nodes, in racks of eight nodes of one shape
(the order of the node list), and gangs of 2-8 members (seeded), each member one of the trace's
8-GPU pods (all members of a gang alike), every gang required to fit one rack
(``shoal.dev/topology-required``), until 130% of those GPUs were asked for. Reported: GPU
allocation at 100% and 130%, and the share of the gangs whose members fit only the scarcest rack
shape (the largest) turned away before demand reached 100%.

Each arriving pod (or gang) is counted in a ``ShapeLedger`` whose view goes with the request
(``Request.likely``: the shapes that arrived count in what a placement costs), as the live loop
and the simulator count the gangs of each step (``Config.shapes``); ``--no-learn`` leaves it
empty, as ``--arrived-shapes=false`` does (docs/benchmarks.md).

The trace is not kept here (its folder in the repository carries no licence): pass the folder
that holds the CSV files (``--trace``), taken from github.com/alibaba/clusterdata,
``cluster-trace-gpu-v2023/csv/``; see docs/benchmarks.md.

    .venv/bin/python -m bench.hetero_fit --trace DIR [--mix default] [--seeds 3] [--demand 1.3]
    .venv/bin/python -m bench.hetero_fit --trace DIR --gangs [--seeds 3]
    .venv/bin/python -m bench.hetero_fit --trace DIR --seed 1 --arrivals 2500 --policy shoal
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from contracts import names
from scheduler.cache import Cache
from scheduler.cycle import Config
from scheduler.model import GangKey, Node, NodeName, Placement, PodKey, PodRequest, Resources
from scheduler.placement import Request, place
from scheduler.placement.shapes import ShapeLedger
from scheduler.simulate.engine import POLICIES

MIB = 2**20
DEFAULT_TRACE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "alibaba-gpu-v2023"


def read_nodes(trace: Path) -> list[Node]:
    """Every node of ``openb_node_list_all_node.csv``: its CPU, memory and GPUs."""
    with (trace / "openb_node_list_all_node.csv").open() as f:
        return [
            Node(
                name=NodeName(row["sn"]),
                labels={},
                allocatable=Resources(
                    int(row["cpu_milli"]), int(row["memory_mib"]) * MIB, int(row["gpu"]), 110
                ),
            )
            for row in csv.DictReader(f)
        ]


def read_pods(trace: Path, mix: str) -> list[Resources]:
    """What each pod of ``openb_pod_list_<mix>.csv`` asks for (whole GPUs)."""
    with (trace / f"openb_pod_list_{mix}.csv").open() as f:
        return [
            Resources(int(row["cpu_milli"]), int(row["memory_mib"]) * MIB, int(row["num_gpu"]), 1)
            for row in csv.DictReader(f)
        ]


def arrivals(pods: list[Resources], seed: int, gpus: int) -> list[Resources]:
    """The pods in a seeded random order (shuffled again each pass) until they ask ``gpus``."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible workload, not a secret
    out: list[Resources] = []
    asked = 0
    while asked < gpus:
        order = list(pods)
        rng.shuffle(order)
        for pod in order:
            out.append(pod)
            asked += pod.gpu
            if asked >= gpus:
                break
    return out


@dataclass
class Run:
    alloc_100: float = 0.0
    alloc_130: float = 0.0
    big_before_100: int = 0
    big_refused_before_100: int = 0
    refused: int = 0
    decisions_ms: list[float] | None = None


def fill(
    nodes: list[Node], stream: list[Resources], config: Config, demand: float, *, learn: bool = True
) -> Run:
    cache = Cache(topology_keys=config.topology_keys)
    for n in nodes:
        cache.set_node(n)
    ledger = ShapeLedger()
    capacity = sum(n.allocatable.gpu for n in nodes)
    biggest = max(p.gpu for p in stream)
    run = Run(decisions_ms=[])
    asked = used = 0
    for i, requests in enumerate(stream):
        before_full = asked < capacity
        asked += requests.gpu
        pod = PodRequest(
            key=PodKey(f"fit/p{i}"),
            namespace="fit",
            name=f"p{i}",
            uid=f"p{i}",
            requests=requests,
            scheduler_name=names.SCHEDULER_NAME,
        )
        if learn:
            ledger.observe([requests], now=float(i))
        request = Request(
            gang=GangKey(f"fit/p{i}"),
            pods=[pod],
            topology_keys=config.topology_keys,
            weights=config.weights,
            likely=ledger.likely(),
        )
        snap = cache.snapshot()
        started = time.process_time()
        result = place(request, snap.nodes, snap.domains, snap.origin)
        run.decisions_ms.append((time.process_time() - started) * 1000)
        big = requests.gpu == biggest
        run.big_before_100 += big and before_full
        if isinstance(result, Placement):
            cache.set_pod(replace(pod, node=result.assignments[0].node))
            used += requests.gpu
        else:
            run.refused += 1
            run.big_refused_before_100 += big and before_full
        if before_full and asked >= capacity:
            run.alloc_100 = used / capacity
        if asked >= demand * capacity:
            break
    run.alloc_130 = used / capacity
    return run


def racked(nodes: list[Node]) -> list[Node]:
    """The 8-GPU nodes, in racks of eight nodes of one shape."""
    by_shape: dict[tuple[int, int], list[Node]] = {}
    for n in nodes:
        if n.allocatable.gpu == 8:
            by_shape.setdefault((n.allocatable.cpu_milli, n.allocatable.memory), []).append(n)
    out = []
    for s, (_, group) in enumerate(sorted(by_shape.items())):
        for i, n in enumerate(group):
            out.append(replace(n, labels={names.RACK_LABEL: f"rack-{s}-{i // 8}"}))
    return out


@dataclass
class GangRun:
    alloc_100: float = 0.0
    alloc_130: float = 0.0
    big_before_100: int = 0
    big_refused_before_100: int = 0
    decisions_ms: list[float] = field(default_factory=list)


def fill_gangs(
    nodes: list[Node],
    members: list[Resources],
    seed: int,
    config: Config,
    demand: float,
    *,
    learn: bool = True,
) -> GangRun:
    """Gangs of 2-8 alike 8-GPU members, each required in one rack, until ``demand``."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible workload, not a secret
    ledger = ShapeLedger()
    cache = Cache(topology_keys=config.topology_keys)
    for n in nodes:
        cache.set_node(n)
    capacity = sum(n.allocatable.gpu for n in nodes)

    # The largest members: those only the scarcest node shape that holds any 8-GPU pod can hold.
    def hosts(m: Resources) -> int:
        return sum(n.allocatable.covers(m) for n in nodes)

    fewest = min(hosts(m) for m in members)
    run = GangRun()
    asked = used = 0
    g = 0
    while asked < demand * capacity:
        g += 1
        member = rng.choice(members)
        size = rng.randint(2, 8)
        before_full = asked < capacity
        asked += member.gpu * size
        pods = [
            PodRequest(
                key=PodKey(f"fit/g{g}-{i}"),
                namespace="fit",
                name=f"g{g}-{i}",
                uid=f"g{g}-{i}",
                requests=member,
                scheduler_name=names.SCHEDULER_NAME,
            )
            for i in range(size)
        ]
        if learn:
            ledger.observe([member] * size, now=float(g))
        request = Request(
            gang=GangKey(f"fit/g{g}"),
            pods=pods,
            topology_keys=config.topology_keys,
            required=names.RACK_LABEL,
            weights=config.weights,
            likely=ledger.likely(),
        )
        snap = cache.snapshot()
        started = time.process_time()
        result = place(request, snap.nodes, snap.domains, snap.origin)
        run.decisions_ms.append((time.process_time() - started) * 1000)
        big = hosts(member) == fewest
        run.big_before_100 += big and before_full
        if isinstance(result, Placement):
            where = {a.pod: a.node for a in result.assignments}
            for p in pods:
                cache.set_pod(replace(p, node=where[p.key]))
            used += member.gpu * size
        else:
            run.big_refused_before_100 += big and before_full
        if before_full and asked >= capacity:
            run.alloc_100 = used / capacity
    run.alloc_130 = used / capacity
    return run


def gangs_main(args: argparse.Namespace, nodes: list[Node], policies: list[str]) -> int:
    racks = racked(nodes)
    members = [p for mix in args.mix or ["default"] for p in read_pods(args.trace, mix)]
    members = [p for p in members if p.gpu == 8]
    capacity = sum(n.allocatable.gpu for n in racks)
    shapes = sorted(
        {(n.allocatable.cpu_milli // 1000, n.allocatable.memory // 2**30) for n in racks}
    )
    print(f"{len(racks)} 8-GPU nodes (CPUs, GiB: {shapes}), {capacity} GPUs, racks of 8")
    print(
        f"{'policy':16} {'alloc@100%':>10} {'alloc@130%':>10} {'largest gangs refused <100%':>28}"
        f" {'ms/gang p50':>11} {'p99':>6}"
    )
    for policy in policies:
        runs = [
            fill_gangs(racks, members, seed, POLICIES[policy], args.demand, learn=args.learn)
            for seed in seeds(args)
        ]
        big = sum(r.big_before_100 for r in runs)
        refused = sum(r.big_refused_before_100 for r in runs)
        ms = sorted(m for r in runs for m in r.decisions_ms)
        print(
            f"{policy:16} {statistics.mean(r.alloc_100 for r in runs):>10.4f}"
            f" {statistics.mean(r.alloc_130 for r in runs):>10.4f}"
            f" {refused / big if big else 0.0:>20.3f} ({refused}/{big})"
            f" {ms[len(ms) // 2]:>11.2f} {ms[int(len(ms) * 0.99)]:>6.2f}",
            flush=True,
        )
        for seed, r in zip(seeds(args), runs, strict=True):
            print(
                f"  seed {seed}: {r.alloc_100:.4f} {r.alloc_130:.4f}"
                f" {r.big_refused_before_100}/{r.big_before_100}",
                flush=True,
            )
    return 0


def seeds(args: argparse.Namespace) -> list[int]:
    """The seeds to run: ``--seed`` as given, else 1 to ``--seeds``."""
    return list(args.seed or range(1, args.seeds + 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--mix", action="append", help="openb_pod_list_<MIX>.csv (repeatable)")
    parser.add_argument("--seeds", type=int, default=3, help="runs, seeds 1..N")
    parser.add_argument("--demand", type=float, default=1.3)
    parser.add_argument("--policy", action="append", choices=sorted(POLICIES))
    parser.add_argument("--gangs", action="store_true", help="gangs in racks (see above)")
    parser.add_argument(
        "--no-learn",
        dest="learn",
        action="store_false",
        help="do not tell the placement the shapes that arrived (a ShapeLedger's)",
    )
    parser.add_argument("--seed", type=int, action="append", help="run only these seeds")
    parser.add_argument(
        "--arrivals", type=int, help="place only the first N arrivals of each run (for timing)"
    )
    args = parser.parse_args(argv)
    nodes = read_nodes(args.trace)
    capacity = sum(n.allocatable.gpu for n in nodes)
    policies = args.policy or ["shoal", "best-fit", "least-allocated"]
    if args.gangs:
        return gangs_main(args, nodes, policies)
    print(f"{len(nodes)} nodes, {capacity} GPUs; demand up to {args.demand:.0%}")
    print(
        f"{'mix':12} {'policy':16} {'alloc@100%':>10} {'alloc@130%':>10}"
        f" {'8-GPU refused <100%':>20} {'ms/pod p50':>10} {'p99':>6}"
    )
    for mix in args.mix or ["default"]:
        pods = read_pods(args.trace, mix)
        for policy in policies:
            runs = []
            for seed in seeds(args):
                stream = arrivals(pods, seed, int(capacity * args.demand) + 1)[: args.arrivals]
                runs.append(fill(nodes, stream, POLICIES[policy], args.demand, learn=args.learn))
            ms = sorted(m for r in runs for m in r.decisions_ms or [])
            big = sum(r.big_before_100 for r in runs)
            refused = sum(r.big_refused_before_100 for r in runs)
            print(
                f"{mix:12} {policy:16} {statistics.mean(r.alloc_100 for r in runs):>10.4f}"
                f" {statistics.mean(r.alloc_130 for r in runs):>10.4f}"
                f" {refused / big if big else 0.0:>13.3f} ({refused}/{big})"
                f" {ms[len(ms) // 2]:>10.2f} {ms[int(len(ms) * 0.99)]:>6.2f}",
                flush=True,
            )
            for seed, r in zip(seeds(args), runs, strict=True):
                print(
                    f"  seed {seed}: {r.alloc_100:.4f} {r.alloc_130:.4f}"
                    f" {r.big_refused_before_100}/{r.big_before_100}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
