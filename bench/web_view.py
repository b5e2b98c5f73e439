"""What the web view costs: the loop's hand-over (``Feed.observe``, per cycle) and the
publisher's document (built off the loop at most every 0.5 s, while something changes), for a
cluster of N 8-GPU nodes (racks of 20, islands of 4, 30% spot) full of 8-member gangs of one-GPU
pods, a tenth of them waiting with a reason.

    .venv/bin/python -m bench.web_view [--nodes 1000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace

from contracts import gputopology, names
from scheduler.cache import Cache
from scheduler.gang.build import build_gangs
from scheduler.model import GangKey, Node, NodeName, PodKey, PodRequest, Resources
from scheduler.web.feed import Feed

GIB = 2**30


def cluster(count: int) -> Cache:
    cache = Cache()
    for i in range(count):
        name = f"gpu-{i:05d}"
        labels = {names.RACK_LABEL: f"rack-{i // 20}", names.ZONE_LABEL: "zone-a"}
        if i % 10 < 3:
            labels[names.CAPACITY_TYPE_LABEL] = "spot"
        cache.set_node(
            Node(
                NodeName(name),
                labels,
                Resources(96_000, 1024 * GIB, 8, 110),
                spot=i % 10 < 3,
                gpu_topology=gputopology.uniform(8, 4, node_name=name),
            )
        )
    for g in range(count):  # one gang of 8 per node: 9 in 10 bound, the rest waiting
        bound = g % 10 != 0
        for m in range(8):
            pod = f"g{g}-{m}"
            cache.set_pod(
                PodRequest(
                    PodKey(f"ml/{pod}"),
                    "ml",
                    pod,
                    f"uid-{pod}",
                    Resources(1000, GIB, 1, 1),
                    scheduler_name=names.SCHEDULER_NAME,
                    node=NodeName(f"gpu-{g:05d}") if bound else None,
                    labels={names.GANG_LABEL: f"g{g}"},
                    annotations={names.MIN_MEMBER_ANNOTATION: "8"},
                )
            )
    return cache


def _build(feed: Feed, cache: Cache) -> tuple[float, int]:
    snapshot = cache.snapshot()
    gangs, invalid = build_gangs(snapshot.pods.values(), snapshot.pod_groups, names.SCHEDULER_NAME)
    feed.observe(snapshot, gangs, invalid, 0.0)
    started = time.perf_counter()
    doc = feed.document()
    took = time.perf_counter() - started
    return took, len(json.dumps(doc, separators=(",", ":")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    cache = cluster(args.nodes)
    snapshot = cache.snapshot()
    gangs, invalid = build_gangs(snapshot.pods.values(), snapshot.pod_groups, names.SCHEDULER_NAME)
    feed = Feed(names.SCHEDULER_NAME)
    for gang in gangs:
        if gang.pending:
            feed.reason(GangKey(gang.key), "0/N nodes are available: N Insufficient GPU.", False)
    calls = 100_000
    started = time.perf_counter()
    for _ in range(calls):
        feed.observe(snapshot, gangs, invalid, 0.0)
    observe_us = (time.perf_counter() - started) / calls * 1e6
    cold, size = _build(feed, cache)
    warm = []
    for r in range(args.repeat):  # 1% of the nodes change between two documents
        for g in range(r % 10, args.nodes, 100):
            pod = cache.snapshot().pods[PodKey(f"ml/g{g}-0")]
            cache.set_pod(replace(pod, node=None if pod.node else NodeName(f"gpu-{g:05d}")))
        warm.append(_build(feed, cache)[0])
    warm_ms = statistics.median(warm) * 1000
    print(
        f"nodes={args.nodes} pods={len(snapshot.pods)} gangs={len(gangs)} "
        f"observe_us={observe_us:.2f} document_cold_ms={cold * 1000:.1f} "
        f"document_1pct_changed_ms={warm_ms:.1f} document_kib={size / 1024:.0f} "
        f"publisher_share_at_2hz={warm_ms * 2 / 1000:.1%}"
    )


if __name__ == "__main__":
    main()
