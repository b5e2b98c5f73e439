"""The demo: a local cluster of kwok GPU nodes, then the elastic-training scenario.

The scenario itself (Shoal scheduler, node agents, elastic jobs and a spot revocation) arrives
with the scheduler and node-agent work; until then the demo sets up the cluster it will run on,
shows it, and says so plainly.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from contracts import gputopology, names
from devcluster import build, cluster, nodes


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="make demo", description=__doc__)
    p.add_argument(
        "--nodes",
        type=int,
        default=int(os.environ.get("SHOAL_DEMO_NODES", "16")),
        help="kwok GPU nodes, 8 GPUs each [env SHOAL_DEMO_NODES] (default %(default)s)",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        default=os.environ.get("SHOAL_DEMO_KEEP") == "1",
        help="leave the cluster up and print its kubeconfig [env SHOAL_DEMO_KEEP=1]",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    console = Console(stderr=True)
    bin_dir = build.build()
    run_dir = Path(tempfile.mkdtemp(prefix="shoal-demo-"))
    c = cluster.up(run_dir, bin_dir, cluster.Options(die_with_parent=not args.keep))
    try:
        spec = nodes.NodeSpec(count=args.nodes, gpus=8, prefix="demo-gpu", spot_fraction=0.5)
        created = nodes.create(str(c.kubeconfig), spec)
        table = _node_table(str(c.kubeconfig), set(created))
        console.print(table)
        console.print(
            "[yellow]The elastic-training scenario is not built yet[/yellow]: it needs the Shoal "
            "scheduler and node agent. The cluster above is what it will run on."
        )
        if args.keep:
            console.print(
                f"Cluster left running. kubeconfig: {c.kubeconfig}\n"
                f"Stop it with: python -m devcluster --run-dir {run_dir} down"
            )
    finally:
        if not args.keep:
            cluster.down(run_dir, say=lambda _m: None)
    return 0


def _node_table(kubeconfig: str, wanted: set[str], timeout: float = 60) -> Table:
    """The nodes as the API server has them, once kwok has marked every one Ready."""
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=kubeconfig)
    try:
        deadline = time.monotonic() + timeout
        while True:
            items = [
                n for n in client.CoreV1Api(api).list_node().items if n.metadata.name in wanted
            ]
            ready = [n for n in items if _is_ready(n)]
            if len(ready) == len(wanted) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        api.close()
    table = Table(title=f"{len(ready)}/{len(wanted)} kwok GPU nodes Ready on a real control plane")
    for column in ("node", "rack", "capacity", "GPUs", "NVLink islands", "Ready"):
        table.add_column(column)
    for node in sorted(items, key=lambda n: str(n.metadata.name)):
        labels = node.metadata.labels
        raw = node.metadata.annotations.get(names.GPU_TOPOLOGY_ANNOTATION)
        islands = (
            " ".join(
                "[" + ",".join(map(str, sorted(m))) + "]"
                for m in gputopology.decode(raw).islands().values()
            )
            if raw
            else "-"
        )
        table.add_row(
            node.metadata.name,
            labels.get(names.RACK_LABEL, "-"),
            labels.get(names.CAPACITY_TYPE_LABEL, "-"),
            node.status.allocatable.get(names.GPU_RESOURCE, "0"),
            islands,
            "yes" if _is_ready(node) else "no",
        )
    return table


def _is_ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


if __name__ == "__main__":
    sys.exit(main())
