"""``python -m scheduler.simulate --cluster FILE --jobs FILE [--spot-trace FILE] --out DIR``."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scheduler.model import Node
from scheduler.simulate import engine, inputs, report


def parser() -> argparse.ArgumentParser:
    """The command line; every option also has an environment variable."""
    p = argparse.ArgumentParser(
        prog="python -m scheduler.simulate",
        description="Replay a job trace (and a spot trace) through the scheduling core on a "
        "virtual clock and compare placement policies on the same input.",
    )
    _add_files(p)
    _add_selection(p)
    _add_conditions(p)
    return p


def _add_files(p: argparse.ArgumentParser) -> None:
    """What is read (the cluster, the job trace, a spot trace) and where results go."""
    env = os.environ.get
    p.add_argument(
        "--cluster",
        type=Path,
        default=env("SHOAL_SIM_CLUSTER"),
        required=not env("SHOAL_SIM_CLUSTER"),
        help="cluster: JSON node groups or a Tiresias shape CSV [env SHOAL_SIM_CLUSTER]",
    )
    p.add_argument(
        "--jobs",
        type=Path,
        default=env("SHOAL_SIM_JOBS"),
        required=not env("SHOAL_SIM_JOBS"),
        help="job trace CSV: Philly, Tiresias or native columns [env SHOAL_SIM_JOBS]",
    )
    p.add_argument(
        "--spot-trace",
        type=Path,
        default=env("SHOAL_SIM_SPOT"),
        help="spot trace: milliseconds,add|remove,node [env SHOAL_SIM_SPOT]",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path(env("SHOAL_SIM_OUT", "sim-out")),
        help="output folder for summary.json and plots [env SHOAL_SIM_OUT] (default %(default)s)",
    )


def _add_selection(p: argparse.ArgumentParser) -> None:
    """Which policies run, on which jobs of the trace."""
    env = os.environ.get
    p.add_argument(
        "--policies",
        default=env("SHOAL_SIM_POLICIES", ",".join(engine.POLICIES)),
        help="comma-separated policies [env SHOAL_SIM_POLICIES] (default %(default)s)",
    )
    p.add_argument(
        "--limit",
        type=int,
        default=int(env("SHOAL_SIM_LIMIT", "0")) or None,
        help="use only the first N jobs of the trace [env SHOAL_SIM_LIMIT]",
    )
    p.add_argument(
        "--min-gpus",
        type=int,
        default=int(env("SHOAL_SIM_MIN_GPUS", "0")),
        help="keep only jobs of at least this many GPUs at full size, before --limit "
        "[env SHOAL_SIM_MIN_GPUS]",
    )


def _add_conditions(p: argparse.ArgumentParser) -> None:
    """The simulated world: revocation notice, checkpoints, how long the clock runs."""
    env = os.environ.get
    p.add_argument(
        "--notice",
        type=float,
        default=float(env("SHOAL_SIM_NOTICE", "120")),
        help="revocation notice, seconds (AWS 120, GCP/Azure 30, Alibaba 300) "
        "[env SHOAL_SIM_NOTICE] (default %(default)s)",
    )
    p.add_argument(
        "--checkpoint-interval",
        type=float,
        default=float(env("SHOAL_SIM_CKPT_INTERVAL", "1800")),
        help="periodic checkpoint interval, seconds [env SHOAL_SIM_CKPT_INTERVAL] "
        "(default %(default)s)",
    )
    p.add_argument(
        "--horizon",
        type=float,
        default=float(env("SHOAL_SIM_HORIZON", "0")) or None,
        help="stop the clock after this many simulated seconds [env SHOAL_SIM_HORIZON]",
    )
    p.add_argument(
        "--spot-repeat",
        action="store_true",
        default=env("SHOAL_SIM_SPOT_REPEAT") == "1",
        help="replay the spot trace back to back until the last job is submitted (spot traces "
        "span hours, job traces weeks) [env SHOAL_SIM_SPOT_REPEAT=1]",
    )


def main(argv: list[str] | None = None) -> int:
    """Run every policy on the same inputs, write the summary and plots, print the table.

    Exit status 2 for an unknown policy or an input that cannot be read.
    """
    args = parser().parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in engine.POLICIES]
    if unknown:
        print(
            f"simulate: unknown policies {unknown}; choose from {sorted(engine.POLICIES)}",
            file=sys.stderr,
        )
        return 2
    try:
        loaded = _load(args)
    except (OSError, inputs.InputError) as exc:
        print(f"simulate: {exc}", file=sys.stderr)
        return 2
    _warn_too_big(loaded)
    results = [
        _simulate(loaded, policy, settings) for policy, settings in _runs(args, policies, loaded)
    ]
    written = report.write(results, args.out, _described(args, loaded))
    print(report.table(results))
    for path in written:
        print(path)
    return 0


@dataclass(frozen=True, slots=True)
class _Inputs:
    """The cluster's nodes, the jobs and the spot trace, as every run gets them."""

    nodes: list[Node]
    jobs: list[inputs.JobSpec]
    spot: list[inputs.SpotEvent]


def _load(args: argparse.Namespace) -> _Inputs:
    """Read the files; jobs are sized by the largest node, the spot trace repeated if asked."""
    nodes = inputs.build_nodes(inputs.load_cluster(args.cluster))
    node_gpus = max(n.allocatable.gpu for n in nodes)
    jobs = inputs.load_jobs(args.jobs, node_gpus, limit=args.limit, min_gpus=args.min_gpus)
    spot = inputs.load_spot(args.spot_trace) if args.spot_trace else []
    if spot and args.spot_repeat:
        spot = inputs.repeat_spot(spot, until=jobs[-1].submit)
    return _Inputs(nodes, jobs, spot)


def _warn_too_big(loaded: _Inputs) -> None:
    """Say how many jobs need more GPUs than the whole cluster has (they never start)."""
    cluster_gpus = sum(n.allocatable.gpu for n in loaded.nodes)
    too_big = [j.id for j in loaded.jobs if j.pod_gpus * j.min_pods > cluster_gpus]
    if too_big:
        print(
            f"simulate: {len(too_big)} jobs need more GPUs than the cluster has and will "
            f"never start (first: {too_big[0]})",
            file=sys.stderr,
        )


def _runs(
    args: argparse.Namespace, policies: list[str], loaded: _Inputs
) -> list[tuple[str, engine.Settings]]:
    """One run per policy; with a spot trace, Shoal once more with periodic checkpoints only,
    to show what checkpointing on notice saves."""
    base = engine.Settings(
        notice_seconds=args.notice,
        checkpoint_interval=args.checkpoint_interval,
        horizon=args.horizon,
    )
    runs: list[tuple[str, engine.Settings]] = [(p, base) for p in policies]
    if loaded.spot and "shoal" in policies:
        runs.append(("shoal", dataclasses.replace(base, checkpoint_on_notice=False)))
    return runs


def _simulate(loaded: _Inputs, policy: str, settings: engine.Settings) -> engine.Result:
    """One run, announced before and summed up after on stderr."""
    label = policy if settings.checkpoint_on_notice else f"{policy} (periodic checkpoints only)"
    print(
        f"simulate: {label}: {len(loaded.jobs)} jobs on {len(loaded.nodes)} nodes ...",
        file=sys.stderr,
    )
    result = engine.Simulation(loaded.nodes, loaded.jobs, loaded.spot, policy, settings).run()
    s = result.summary()
    print(
        f"simulate: {label}: {s['jobs_finished']}/{s['jobs']} finished, allocation "
        f"{s['gpu_allocation_mean']}, JCT mean {s['jct_mean_s']} s, "
        f"{result.wall_seconds:.1f} s wall",
        file=sys.stderr,
    )
    return result


def _described(args: argparse.Namespace, loaded: _Inputs) -> dict[str, Any]:
    """The inputs and options as the summary records them."""
    return {
        "cluster": str(args.cluster),
        "jobs": str(args.jobs),
        "spot_trace": str(args.spot_trace) if args.spot_trace else None,
        "job_count": len(loaded.jobs),
        "nodes": len(loaded.nodes),
        "limit": args.limit,
        "min_gpus": args.min_gpus,
        "notice_seconds": args.notice,
        "spot_repeat": args.spot_repeat,
        "checkpoint_interval": args.checkpoint_interval,
        "elastic_rule": "pod GPUs = min(G, GPUs per node); members n = ceil(G / pod GPUs); "
        "min = ceil(n / 2); max = n (Pollux workloads: n = num_replicas members of 1 GPU, "
        "duration per application from inputs.POLLUX_DURATIONS)",
    }
