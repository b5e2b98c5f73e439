"""``python -m devcluster build | up | down | status | nodes``; flags also read env vars."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

from devcluster import browser, cluster, faketime, tools, versions
from devcluster import build as builder
from devcluster.errors import DevclusterError, NotRunningError

RUN_DIR_ENV = "SHOAL_DEVCLUSTER_RUN_DIR"


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m devcluster",
        description=(
            "A real local Kubernetes control plane (etcd, kube-apiserver, "
            "kube-controller-manager, kwok) built from the pinned Go modules and run on loopback."
        ),
        epilog=(
            f"Environment: {versions.CACHE_ENV} (binary cache, default "
            f"~/.cache/shoal/devcluster), {RUN_DIR_ENV} (run folder, default "
            "~/.cache/shoal/run/default)."
        ),
    )
    p.add_argument(
        "--run-dir",
        type=Path,
        default=Path(_env(RUN_DIR_ENV, str(cluster.default_run_dir()))),
        help=f"folder for certificates, logs, etcd data and state [env {RUN_DIR_ENV}]",
    )
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser(
        "build",
        help="build the binaries (and the tools the tests use: helm, the Kubeflow "
        "training-operator) once into the cache (no-op when cached)",
    )
    b.add_argument("--force", action="store_true", help="rebuild even when cached")
    b.add_argument("--print-dir", action="store_true", help="print the binary folder and exit 0")

    u = sub.add_parser("up", help="start the control plane and write a kubeconfig")
    u.add_argument(
        "--kubeconfig-out",
        type=Path,
        default=os.environ.get("SHOAL_KUBECONFIG_OUT"),
        help="also copy the admin kubeconfig here [env SHOAL_KUBECONFIG_OUT]",
    )
    u.add_argument(
        "--kube-scheduler",
        action="store_true",
        default=_env("SHOAL_DEVCLUSTER_KUBE_SCHEDULER", "") == "1",
        help="also run the stock kube-scheduler [env SHOAL_DEVCLUSTER_KUBE_SCHEDULER=1]",
    )
    u.add_argument(
        "--feature-gates",
        default=_env("SHOAL_DEVCLUSTER_FEATURE_GATES", ""),
        help="feature gates for every component, e.g. GenericWorkload=true,WorkloadWithJob=true "
        "[env SHOAL_DEVCLUSTER_FEATURE_GATES]",
    )
    u.add_argument(
        "--runtime-config",
        default=_env("SHOAL_DEVCLUSTER_RUNTIME_CONFIG", ""),
        help="the API server's --runtime-config, e.g. scheduling.k8s.io/v1beta1=true "
        "[env SHOAL_DEVCLUSTER_RUNTIME_CONFIG]",
    )

    u.add_argument(
        "--real-nodes",
        type=int,
        default=int(_env("SHOAL_DEVCLUSTER_REAL_NODES", "0")),
        help="also run this many real nodes (kubelet, containerd, runc; root only), each in a "
        "network namespace of its own [env SHOAL_DEVCLUSTER_REAL_NODES]",
    )
    u.add_argument(
        "--real-node-image",
        action="append",
        default=[],
        metavar="OCI_ARCHIVE",
        help="an OCI archive to import into every real node's containerd (repeatable; default: "
        "build/*.oci.tar from `make images`)",
    )
    u.add_argument(
        "--real-node-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra label of every real node (repeatable)",
    )

    sub.add_parser("down", help="stop every process `up` started")
    sub.add_parser(
        "browser",
        help="install Chromium from Debian's packages for the web view's tests (root; no-op "
        "when there is one) and print its path",
    )
    sub.add_parser(
        "faketime",
        help="install libfaketime from Debian's packages for the agent's clock-skew test (root; "
        "no-op when it is there) and print its path",
    )
    sub.add_parser("status", help="print the components, their memory and the API server state")

    n = sub.add_parser("nodes", help="create fake GPU nodes that kwok runs")
    n.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="[env KUBECONFIG]; default: the run folder's admin kubeconfig",
    )

    def flag(name: str, env: str, default: str, kind: type, text: str) -> None:
        n.add_argument(
            name,
            type=kind,
            default=kind(_env(env, default)),
            help=f"{text} [env {env}] (default %(default)s)",
        )

    flag("--count", "SHOAL_NODES_COUNT", "4", int, "number of nodes")
    flag("--gpus", "SHOAL_NODES_GPUS", "8", int, "nvidia.com/gpu per node (0 = CPU-only)")
    flag("--prefix", "SHOAL_NODES_PREFIX", "gpu", str, "node name prefix")
    flag("--product", "SHOAL_NODES_PRODUCT", "NVIDIA-H100-80GB-HBM3", str, "GPU product label")
    flag("--cpu", "SHOAL_NODES_CPU", "96", str, "allocatable cpu")
    flag("--memory", "SHOAL_NODES_MEMORY", "1Ti", str, "allocatable memory")
    flag("--pods", "SHOAL_NODES_PODS", "110", int, "allocatable pods")
    flag("--zones", "SHOAL_NODES_ZONES", "1", int, "zones")
    flag("--racks-per-zone", "SHOAL_NODES_RACKS", "2", int, "racks in each zone")
    flag("--spot-fraction", "SHOAL_NODES_SPOT", "0", float, "share of spot nodes in each rack")
    flag("--island-size", "SHOAL_NODES_ISLAND", "4", int, "GPUs per NVLink island")
    n.add_argument("--no-topology", action="store_true", help="omit shoal.dev/gpu-topology")
    n.add_argument(
        "--no-kwok-taint",
        action="store_true",
        help="omit the kwok.x-k8s.io/node=fake:NoSchedule taint",
    )
    n.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra node label (repeatable)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
        return _run(args)
    except DevclusterError as exc:
        print(f"devcluster: error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"devcluster: invalid argument: {exc}", file=sys.stderr)
        return 2


def _build(args: argparse.Namespace) -> int:
    directory = builder.build(force=args.force)
    for name in tools.TOOLS:
        tools.ensure(name)
    if args.print_dir:
        print(directory)
    return 0


#: The subcommands that install a Debian package a test needs, and print what they installed.
INSTALLERS: dict[str, Callable[[], Path]] = {"browser": browser.ensure, "faketime": faketime.ensure}


def _run(args: argparse.Namespace) -> int:  # noqa: PLR0911 - one return per subcommand
    run_dir: Path = args.run_dir
    if args.command == "build":
        return _build(args)
    if args.command == "up":
        # The components are meant to outlive this command; Python would otherwise warn that
        # its child processes are still running when it exits.
        warnings.simplefilter("ignore", ResourceWarning)
        bin_dir = builder.build()
        options = cluster.Options(
            kube_scheduler=args.kube_scheduler,
            feature_gates=_items(args.feature_gates),
            runtime_config=_items(args.runtime_config),
            real_nodes=args.real_nodes,
            real_node_images=tuple(args.real_node_image or _built_images()),
            real_node_labels=tuple(args.real_node_label),
        )
        c = cluster.up(run_dir, bin_dir, options)
        if args.kubeconfig_out:
            args.kubeconfig_out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(c.kubeconfig, args.kubeconfig_out)
        print(args.kubeconfig_out or c.kubeconfig)
        return 0
    if args.command == "down":
        try:
            stubborn = cluster.down(run_dir)
        except NotRunningError as exc:
            print(f"devcluster: {exc}", file=sys.stderr)
            return 0
        if stubborn:
            print(f"devcluster: error: could not stop {', '.join(stubborn)}", file=sys.stderr)
            return 1
        return 0
    if args.command == "status":
        return _status(run_dir)
    if args.command in INSTALLERS:
        print(INSTALLERS[args.command]())
        return 0
    if args.command == "nodes":
        return _nodes(args)
    raise AssertionError(args.command)


def _status(run_dir: Path) -> int:
    from devcluster import process

    try:
        c = cluster.Cluster.load(run_dir)
    except NotRunningError as exc:
        print(f"devcluster: {exc}")
        return 3
    rss = c.rss_bytes()
    components = {
        p.name: {
            "pid": p.pid,
            "alive": process.alive(p),
            "rss_mib": round(rss[p.name] / 2**20, 1),
            "log": p.log,
        }
        for p in c.procs
    }
    report = {
        "server": c.server,
        "kubeconfig": str(c.kubeconfig),
        "versions": c.versions,
        "ready_seconds": c.ready_seconds,
        "components": components,
        "rss_mib_total": round(sum(rss.values()) / 2**20, 1),
    }
    print(json.dumps(report, indent=2))
    return 0 if all(v["alive"] for v in components.values()) else 1


def _nodes(args: argparse.Namespace) -> int:
    from devcluster import nodes

    kubeconfig = args.kubeconfig or str(cluster.Cluster.load(args.run_dir).kubeconfig)
    extra = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--label expects KEY=VALUE, got {item!r}")
        extra[key] = value
    spec = nodes.NodeSpec(
        count=args.count,
        gpus=args.gpus,
        prefix=args.prefix,
        product=args.product,
        cpu=args.cpu,
        memory=args.memory,
        pods=args.pods,
        zones=args.zones,
        racks_per_zone=args.racks_per_zone,
        spot_fraction=args.spot_fraction,
        island_size=args.island_size,
        topology=not args.no_topology,
        kwok_taint=not args.no_kwok_taint,
        extra_labels=extra,
    )
    created = nodes.create(kubeconfig, spec)
    print(
        f"devcluster: created {len(created)} nodes ({created[0]} .. {created[-1]})"
        if created
        else "devcluster: no nodes requested"
    )
    return 0


def _built_images() -> list[str]:
    """The archives `make images` wrote, if any."""
    from devcluster import images

    return [str(p) for p in sorted(images.OUT_DIR.glob("*.oci.tar"))]


def _items(text: str) -> tuple[str, ...]:
    """``a=true, b=true`` as ``("a=true", "b=true")``."""
    return tuple(item.strip() for item in text.split(",") if item.strip())
