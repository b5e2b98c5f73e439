"""``python -m slurmcluster install | up | down | exec``: a real Slurm cluster on this machine."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from slurmcluster import cluster, install

RUN_DIR_ENV = "SHOAL_SLURM_RUN_DIR"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m slurmcluster",
        description=(
            "A Slurm cluster from Debian's packages: slurmctld and N slurmd nodes, each in a "
            "network namespace of its own (root only)."
        ),
    )
    p.add_argument(
        "--run-dir",
        type=Path,
        default=Path(os.environ.get(RUN_DIR_ENV, str(cluster.default_run_dir()))),
        help=f"folder for slurm.conf, state, spools and logs [env {RUN_DIR_ENV}]",
    )
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "install",
        help="install Debian's slurmctld, slurmd, slurm-client and munge (root; no-op when "
        "installed)",
    )
    u = sub.add_parser("up", help="start the cluster and print the SLURM_CONF to use")
    u.add_argument("--nodes", type=int, default=3, help="slurmd nodes (default 3)")
    sub.add_parser("down", help="stop the cluster and remove its namespaces")
    e = sub.add_parser("exec", help="run a command on one node (its namespace, SLURM_CONF set)")
    e.add_argument("node", help="node name, e.g. sn0")
    e.add_argument("argv", nargs=argparse.REMAINDER, help="the command (after --)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "install":
            install.ensure()
            return 0
        if args.command == "up":
            reason = install.unavailable()
            if reason:
                print(f"slurmcluster: cannot start: {reason}", file=sys.stderr)
                return 2
            started = cluster.up(args.run_dir, nodes=args.nodes)
            print(f"export SLURM_CONF={started.conf}")
            return 0
        if args.command == "down":
            return 1 if cluster.down(args.run_dir) else 0
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        done = cluster.Cluster.load(args.run_dir).node(args.node).exec(command)
        sys.stdout.write(done.stdout)
        sys.stderr.write(done.stderr)
        return done.returncode
    except (cluster.SlurmClusterError, install.InstallError, KeyError) as fault:
        print(f"slurmcluster: {fault}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
