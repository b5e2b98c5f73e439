"""Fit on every resource: fill a GPU cluster with a seeded mix of CPU-only and GPU pods, one pod
at a time, through the live placement search, under Shoal's scores and under plain GPU best-fit.

No pod leaves, so the cluster only fills up: what each policy strands shows as GPUs that can no
longer be used (free GPUs on nodes without the CPU or memory to run a GPU pod) and as 8-GPU pods
turned away while enough GPUs are free in total. The mix is synthetic and seeded (its shape is
printed); CPU-only pods are a quarter of the pods by default.

    .venv/bin/python -m bench.fit [--nodes 64] [--pods 3000] [--seed 1] [--cpu-only 0.25]
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter
from dataclasses import dataclass, replace

from contracts import names
from scheduler.cache import Cache
from scheduler.cycle import Config
from scheduler.model import GangKey, Node, NodeName, Placement, PodKey, PodRequest, Resources
from scheduler.placement import Request, place
from scheduler.simulate.engine import POLICIES

GIB = 2**30


@dataclass(frozen=True, slots=True)
class Shape:
    gpus: int
    cpu_milli: int
    memory: int


def mix(count: int, seed: int, cpu_only: float) -> list[Shape]:
    """GPU pods of 1, 2, 4 or 8 GPUs with 4-12 CPUs and 16-96 GiB per GPU; CPU-only pods of
    4-32 CPUs and 8-128 GiB."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible workload, not a secret
    shapes = []
    for _ in range(count):
        if rng.random() < cpu_only:
            shapes.append(
                Shape(0, rng.choice((4, 8, 16, 32)) * 1000, rng.choice((8, 32, 128)) * GIB)
            )
            continue
        gpus = rng.choices((1, 2, 4, 8), weights=(5, 2, 2, 3))[0]
        shapes.append(
            Shape(gpus, gpus * rng.randint(4, 12) * 1000, gpus * rng.choice((16, 48, 96)) * GIB)
        )
    return shapes


def cluster(count: int) -> list[Node]:
    """8-GPU nodes of 96 CPUs and 1 TiB, racks of 8."""
    return [
        Node(
            name=NodeName(f"gpu-{i:03d}"),
            labels={names.RACK_LABEL: f"rack-{i // 8}"},
            allocatable=Resources(96_000, 1024 * GIB, 8, 110),
        )
        for i in range(count)
    ]


def fill(nodes: list[Node], shapes: list[Shape], config: Config) -> dict[str, float]:
    cache = Cache()
    for n in nodes:
        cache.set_node(n)
    capacity = sum(n.allocatable.gpu for n in nodes)
    used = placed_big = refused_big_with_room = refused = 0
    first_big_refusal: float | None = None
    started = time.process_time()
    for i, shape in enumerate(shapes):
        pod = PodRequest(
            key=PodKey(f"fit/p{i}"),
            namespace="fit",
            name=f"p{i}",
            uid=f"p{i}",
            requests=Resources(shape.cpu_milli, shape.memory, shape.gpus, 1),
            scheduler_name=names.SCHEDULER_NAME,
        )
        request = Request(
            gang=GangKey(f"fit/p{i}"),
            pods=[pod],
            topology_keys=config.topology_keys,
            weights=config.weights,
        )
        result = place(request, cache.snapshot().nodes)
        if isinstance(result, Placement):
            cache.set_pod(replace(pod, node=result.assignments[0].node))
            used += shape.gpus
            placed_big += shape.gpus == 8
            continue
        refused += 1
        if shape.gpus == 8:
            refused_big_with_room += capacity - used >= 8
            if first_big_refusal is None:
                first_big_refusal = used / capacity
    return {
        "gpu_allocation": used / capacity,
        "allocation_at_first_8gpu_refusal": first_big_refusal or used / capacity,
        "pods_refused": refused,
        "8gpu_pods_placed": placed_big,
        "8gpu_refused_with_8_free": refused_big_with_room,
        "cpu_s": time.process_time() - started,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--pods", type=int, default=3000)
    parser.add_argument("--seeds", type=int, default=5, help="runs, seeds 1..N")
    parser.add_argument("--cpu-only", type=float, default=0.25, help="share of CPU-only pods")
    args = parser.parse_args(argv)
    nodes = cluster(args.nodes)
    rows: dict[str, list[dict[str, float]]] = {"shoal": [], "best-fit": []}
    for seed in range(1, args.seeds + 1):
        shapes = mix(args.pods, seed, args.cpu_only)
        if seed == 1:
            print(
                "mix (seed 1):",
                dict(sorted(Counter(s.gpus for s in shapes).items())),
                "pods by GPUs",
            )
        for policy, runs in rows.items():
            runs.append(fill(nodes, shapes, POLICIES[policy]))
    print(
        f"{args.nodes} nodes x 8 GPUs, {args.pods} pods per run, {args.seeds} seeds,"
        f" cpu-only share {args.cpu_only}"
    )
    print(
        f"{'policy':10} {'GPU alloc':>10} {'at 1st 8-GPU refusal':>21} {'8-GPU placed':>13}"
        f" {'8-GPU refused with 8 GPUs free':>31} {'cpu s':>6}"
    )
    for policy, runs in rows.items():
        mean = {k: sum(r[k] for r in runs) / len(runs) for k in runs[0]}
        print(
            f"{policy:10} {mean['gpu_allocation']:>10.3f}"
            f" {mean['allocation_at_first_8gpu_refusal']:>21.3f} {mean['8gpu_pods_placed']:>13.1f}"
            f" {mean['8gpu_refused_with_8_free']:>31.1f} {mean['cpu_s']:>6.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
