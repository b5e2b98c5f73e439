"""``python -m scheduler.simulate --cluster FILE --jobs FILE [--spot-trace FILE] --out DIR``."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from concurrent.futures import ProcessPoolExecutor
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
    _add_losses(p)
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
    p.add_argument(
        "--no-arrived-shapes",
        dest="arrived_shapes",
        action="store_false",
        default=env("SHOAL_SIM_ARRIVED_SHAPES", "1") != "0",
        help="Shoal's placement counts only the node shapes' shares, not the pod shapes and gang "
        "sizes that arrived (the live --arrived-shapes=false) [env SHOAL_SIM_ARRIVED_SHAPES=0]",
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
        "--processes",
        type=int,
        default=int(env("SHOAL_SIM_PROCESSES", "1")),
        help="run this many runs at once, each in a process of its own; the figures do not "
        "depend on it [env SHOAL_SIM_PROCESSES] (default %(default)s)",
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


#: Revocation notice per cloud, seconds (each provider's documented figure).
CLOUD_NOTICE: dict[str, float] = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}


def _add_losses(p: argparse.ArgumentParser) -> None:
    """What a checkpoint costs, which of Shoal's loss features are on, and a comparison of them
    (docs/benchmarks.md, "Losing the least on spot")."""
    env = os.environ.get
    p.add_argument(
        "--cloud",
        choices=sorted(CLOUD_NOTICE),
        default=env("SHOAL_SIM_CLOUD"),
        help="the cloud's revocation notice (aws 120 s, gcp 30 s, azure 30 s); overrides "
        "--notice [env SHOAL_SIM_CLOUD]",
    )
    p.add_argument(
        "--checkpoint-seconds",
        type=float,
        default=float(env("SHOAL_SIM_CKPT_SECONDS", "20")),
        help="fixed part of a checkpoint's time, seconds [env SHOAL_SIM_CKPT_SECONDS] "
        "(default %(default)s)",
    )
    p.add_argument(
        "--checkpoint-gb-per-gpu",
        type=float,
        default=float(env("SHOAL_SIM_CKPT_GB_PER_GPU", "0")),
        help="model state written per GPU of the job at full size, GB: a checkpoint takes the "
        "fixed part plus GPUs x this / --storage-gbps [env SHOAL_SIM_CKPT_GB_PER_GPU] "
        "(default %(default)s: every checkpoint takes the fixed part)",
    )
    p.add_argument(
        "--storage-gbps",
        type=float,
        default=float(env("SHOAL_SIM_STORAGE_GBPS", "2.5")),
        help="checkpoint storage write bandwidth, GB/s [env SHOAL_SIM_STORAGE_GBPS] "
        "(default %(default)s)",
    )
    p.add_argument(
        "--features",
        default=env("SHOAL_SIM_FEATURES", ""),
        help=f"Shoal features on in every Shoal run, comma-separated: {', '.join(engine.FEATURES)} "
        "or all [env SHOAL_SIM_FEATURES]",
    )
    p.add_argument(
        "--compare-features",
        action="store_true",
        default=env("SHOAL_SIM_COMPARE_FEATURES") == "1",
        help="run Shoal with no feature, with all but each one, and with all (best-fit and "
        "least-allocated with none) [env SHOAL_SIM_COMPARE_FEATURES=1]",
    )
    p.add_argument(
        "--feature-sets",
        default=env("SHOAL_SIM_FEATURE_SETS", ""),
        help="run Shoal once per set, sets separated by ';' (each as --features takes, or "
        "none), the other policies with none: 'none;all' [env SHOAL_SIM_FEATURE_SETS]",
    )
    p.add_argument(
        "--patience",
        type=float,
        default=float(env("SHOAL_SIM_PATIENCE", "1800")),
        help="with the patience feature: seconds a reclaim may wait for its victims' next "
        "checkpoint [env SHOAL_SIM_PATIENCE] (default %(default)s)",
    )
    p.add_argument(
        "--max-quorum-risk",
        type=float,
        default=float(env("SHOAL_SIM_MAX_QUORUM_RISK", "0.05")),
        help="with the quorum-bound feature: the chance of losing a quorum member within an "
        "hour that a gang whose checkpoint outlasts the notice accepts "
        "[env SHOAL_SIM_MAX_QUORUM_RISK] (default %(default)s)",
    )
    p.add_argument(
        "--max-member-risk",
        type=float,
        default=float(env("SHOAL_SIM_MAX_MEMBER_RISK", "0.05")),
        help="with the member-bound feature: the chance of losing a surplus member within an "
        "hour that a gang whose checkpoint outlasts the notice accepts "
        "[env SHOAL_SIM_MAX_MEMBER_RISK] (default %(default)s)",
    )
    p.add_argument(
        "--warning",
        type=float,
        default=float(env("SHOAL_SIM_WARNING", "0")),
        help="an early warning (rebalance recommendation) this many seconds before each spot "
        "removal; 0: none [env SHOAL_SIM_WARNING] (default %(default)s)",
    )


def _features(text: str) -> frozenset[str]:
    """The features a --features value names; "all" names every one."""
    named = {f.strip() for f in text.split(",") if f.strip()}
    if "all" in named:
        named = (named - {"all"}) | set(engine.FEATURES)
    unknown = named - set(engine.FEATURES)
    if unknown:
        raise inputs.InputError(
            f"unknown features {sorted(unknown)}; choose from {', '.join(engine.FEATURES)}, all"
        )
    return frozenset(named)


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
        features = _features(args.features)
        sets = [_features(s.replace("none", "")) for s in args.feature_sets.split(";") if s]
        loaded = _load(args)
    except (OSError, inputs.InputError) as exc:
        print(f"simulate: {exc}", file=sys.stderr)
        return 2
    _warn_too_big(loaded)
    runs = _runs(args, policies, loaded, features, sets)
    if args.processes > 1 and len(runs) > 1:
        with ProcessPoolExecutor(min(args.processes, len(runs))) as pool:
            futures = [pool.submit(_simulate, loaded, p, s) for p, s in runs]
            results = [f.result() for f in futures]
    else:
        results = [_simulate(loaded, policy, settings) for policy, settings in runs]
    written = report.write(results, args.out, _described(args, loaded))
    print(report.table(results))
    if loaded.spot or features or args.compare_features or sets:
        print()
        print(report.loss_table(results))
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
    args: argparse.Namespace,
    policies: list[str],
    loaded: _Inputs,
    features: frozenset[str],
    sets: list[frozenset[str]],
) -> list[tuple[str, engine.Settings]]:
    """One run per policy (Shoal's with ``features``); with a spot trace, Shoal once more with
    periodic checkpoints only, to show what checkpointing on notice saves. With
    ``--compare-features``, Shoal instead with no feature, with all but each, and with all;
    with ``--feature-sets``, once per set."""
    base = engine.Settings(
        notice_seconds=CLOUD_NOTICE[args.cloud] if args.cloud else args.notice,
        checkpoint_seconds=args.checkpoint_seconds,
        checkpoint_gb_per_gpu=args.checkpoint_gb_per_gpu,
        storage_gb_per_second=args.storage_gbps,
        checkpoint_interval=args.checkpoint_interval,
        horizon=args.horizon,
        patience_seconds=args.patience,
        warning_seconds=args.warning,
        max_quorum_risk=args.max_quorum_risk,
        max_member_risk=args.max_member_risk,
        arrived_shapes=args.arrived_shapes,
    )
    if args.compare_features:
        every = frozenset(engine.FEATURES)
        sets = [frozenset(), *(every - {f} for f in engine.FEATURES), every]
    if sets:
        runs = [
            ("shoal", dataclasses.replace(base, features=f)) for f in sets if "shoal" in policies
        ]
        return runs + [(p, base) for p in policies if p != "shoal"]
    runs = [
        (p, dataclasses.replace(base, features=features) if p == "shoal" else base)
        for p in policies
    ]
    if loaded.spot and "shoal" in policies:
        runs.append(
            ("shoal", dataclasses.replace(base, features=features, checkpoint_on_notice=False))
        )
    return runs


def _simulate(loaded: _Inputs, policy: str, settings: engine.Settings) -> engine.Result:
    """One run, announced before and summed up after on stderr."""
    label = policy if settings.checkpoint_on_notice else f"{policy} (periodic checkpoints only)"
    if settings.features:
        label += f" [{settings.label()}]"
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
        "notice_seconds": CLOUD_NOTICE[args.cloud] if args.cloud else args.notice,
        "cloud": args.cloud,
        "checkpoint_seconds": args.checkpoint_seconds,
        "checkpoint_gb_per_gpu": args.checkpoint_gb_per_gpu,
        "storage_gb_per_second": args.storage_gbps,
        "checkpoint_model": "checkpoint seconds = fixed + job GPUs x GB per GPU / storage GB/s",
        "features": args.features,
        "compare_features": args.compare_features,
        "patience_seconds": args.patience,
        "warning_seconds": args.warning,
        "max_quorum_risk": args.max_quorum_risk,
        "max_member_risk": args.max_member_risk,
        "arrived_shapes": args.arrived_shapes,
        "spot_repeat": args.spot_repeat,
        "checkpoint_interval": args.checkpoint_interval,
        "elastic_rule": "pod GPUs = min(G, GPUs per node); members n = ceil(G / pod GPUs); "
        "min = ceil(n / 2); max = n (Pollux workloads: n = num_replicas members of 1 GPU, "
        "duration per application from inputs.POLLUX_DURATIONS)",
    }
