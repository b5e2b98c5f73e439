"""``make demo``: elastic training surviving a spot revocation and a reclaim on a local cluster.

By default (--workers torch) one elastic gang runs real torchrun training in local processes
that play its pods' containers, through growth, a spot notice, a reclaim for an urgent gang and
regrowth; the summary shows, for each membership change, the step every rank stopped at, the
steps lost (from the checkpoints and the resumed run's first step) and the time to resume.

With --workers simulated, a larger story with counting workers: a real control plane (etcd,
kube-apiserver, kube-controller-manager, kwok) with GPU nodes, the
Shoal scheduler, one Shoal node agent per node, and three elastic jobs. The story: the jobs are
admitted at their minimum and grown to their maximum; a spot node gets an early warning (an AWS
rebalance recommendation; a cordon on the other clouds) and the scheduler moves its surplus
worker before any notice; then that node and another get a revocation notice; the other's
workers checkpoint, acknowledge and leave; the gangs shrink but stay above their minimum and
replacements are placed; an urgent job arrives and reclaims the surplus members whose last
checkpoint is newest (they lose the least); capacity returns and the gangs regrow. Time is
compressed (the notice lead and grace periods are divided by --compression, and the output says
so). The demo exits non-zero if any expectation fails —
a gang partially bound, a step lost, a worker killed before its checkpoint, a warned node still
running a worker at its notice, a reclaim that spared a newer checkpoint than it took.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from demo.scenario import Demo, ExpectationFailed, Options, Show, summary_rows
from devcluster import build
from fakes.clouds import CLOUDS


def parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="make demo  (or: python -m demo)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--workers",
        choices=("torch", "simulated"),
        default=env("SHOAL_DEMO_WORKERS", "torch"),
        help="real torchrun training in local processes, or tasks that count steps "
        "[env SHOAL_DEMO_WORKERS] (default %(default)s)",
    )
    p.add_argument(
        "--nodes",
        type=int,
        default=int(env("SHOAL_DEMO_NODES", "16")),
        help="simulated workers: kwok GPU nodes, 8 GPUs each; 16 plays three jobs, 8 a "
        "shorter story with two [env SHOAL_DEMO_NODES] (default %(default)s)",
    )
    p.add_argument(
        "--cloud",
        choices=sorted(CLOUDS),
        default=env("SHOAL_DEMO_CLOUD", "aws"),
        help="whose metadata protocol and notice to emulate [env SHOAL_DEMO_CLOUD] "
        "(default %(default)s)",
    )
    p.add_argument(
        "--compression",
        type=float,
        default=float(env("SHOAL_DEMO_COMPRESSION", "6")),
        help="divide notice leads and grace periods by this [env "
        "SHOAL_DEMO_COMPRESSION] (default %(default)s)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path(env("SHOAL_DEMO_OUT", "demo-out")),
        help="folder for the summary, the timeline PNG and every component's log "
        "[env SHOAL_DEMO_OUT] (default %(default)s)",
    )
    p.add_argument(
        "--no-live",
        action="store_true",
        default=env("SHOAL_DEMO_NO_LIVE") == "1",
        help="print the event log instead of the live view [env SHOAL_DEMO_NO_LIVE=1]",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        default=env("SHOAL_DEMO_KEEP") == "1",
        help="leave the cluster, scheduler and agents running and print a kubeconfig "
        "[env SHOAL_DEMO_KEEP=1]",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.workers == "torch":
        return torch_main(args)
    return simulated_main(args)


def simulated_main(args: argparse.Namespace) -> int:
    if args.nodes < 8:
        print("demo: --nodes must be at least 8", file=sys.stderr)
        return 2
    if args.compression < 1:
        print("demo: --compression must be at least 1", file=sys.stderr)
        return 2
    console = Console()
    if not console.is_terminal:
        console = Console(width=110)  # logs and CI: wide enough for the summary table
    live_view = not args.no_live and console.is_terminal
    options = Options(
        nodes=args.nodes,
        cloud=args.cloud,
        compression=args.compression,
        out=args.out.resolve(),
        live=live_view,
        keep=args.keep,
    )
    options.out.mkdir(parents=True, exist_ok=True)
    bin_dir = build.build()
    demo = Demo(
        options,
        say=(lambda _line: None) if live_view else console.print,
        show=shower(console),
    )
    try:
        demo.start_cluster(bin_dir)
        if live_view:
            with Live(render(demo), console=console, refresh_per_second=4) as live:
                asyncio.run(demo.run(lambda d: live.update(render(d))))
        else:
            asyncio.run(demo.run(None))
    except ExpectationFailed as exc:
        demo.fail(str(exc))
    except KeyboardInterrupt:
        demo.fail("interrupted")
    finally:
        if args.keep and demo.handle is not None:
            console.print(f"Left running. kubeconfig: {demo.handle.kubeconfig}")
        demo.shutdown()
    rows = summary_rows(demo)
    console.print(summary_table(rows))
    for line in beat_lines(demo.beats):
        console.print(line, soft_wrap=True, markup=False)
    timeline = write_timeline(demo, options.out / "timeline.png")
    return finish(
        console,
        demo,
        options.out,
        {"jobs": rows, "nodes": args.nodes, **demo.beats},
        args,
        files={"timeline": timeline, "summary": options.out / "summary.json"},
        held="no partial gang, no lost step, every worker checkpointed before it left, the "
        "warned node emptied before its notice, the reclaim took the newest checkpoint",
    )


def torch_main(args: argparse.Namespace) -> int:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        print(
            "demo: the real-torch story needs torch (pip install -e '.[dev]'); "
            "or run --workers simulated",
            file=sys.stderr,
        )
        return 2
    from demo.torchstory import TorchDemo

    console = Console() if Console().is_terminal else Console(width=120)
    options = Options(
        cloud=args.cloud,
        compression=args.compression,
        out=args.out.resolve(),
        live=False,
        keep=args.keep,
    )
    options.out.mkdir(parents=True, exist_ok=True)
    bin_dir = build.build()
    demo = TorchDemo(options, say=console.print, show=shower(console))
    try:
        demo.start_cluster(bin_dir)
        asyncio.run(demo.run(None))
    except ExpectationFailed as exc:
        demo.fail(str(exc))
    except KeyboardInterrupt:
        demo.fail("interrupted")
    finally:
        if args.keep and demo.handle is not None:
            console.print(f"Left running. kubeconfig: {demo.handle.kubeconfig}")
        demo.shutdown()
    summary = demo.summary()
    console.print(changes_table(summary))
    timeline = write_torch_timeline(demo, options.out / "timeline.png")
    return finish(
        console,
        demo,
        options.out,
        {"workers": "torch", **summary},
        args,
        files={
            "timeline": timeline,
            "summary": options.out / "summary.json",
            "records": demo.records_path,
        },
        held="every rank stopped at one step at every change, each resumed run started "
        "right after a complete checkpoint, no step lost",
        pod_logs=True,
    )


def finish(
    console: Console,
    demo: Any,
    out: Path,
    figures: dict[str, Any],
    args: argparse.Namespace,
    *,
    files: dict[str, Path],
    held: str,
    pod_logs: bool = False,
) -> int:
    """The end of either story: ``summary.json``, where the files are, and whether every
    expectation held (exit 0) or which failed (exit 1)."""
    (out / "summary.json").write_text(
        json.dumps(
            {
                **figures,
                "web_view": demo.web_url,
                "views": demo.views,
                "failures": demo.failures,
                "events": demo.events,
                "cloud": args.cloud,
                "compression": args.compression,
            },
            indent=2,
        )
        + "\n"
    )
    lines = [f"{name + ':':9} {path}" for name, path in files.items()]
    lines.append(f"{'views:':9} {out / 'views'} (kubectl shoal gangs)")
    lines.append(f"{'logs:':9} {out / 'logs'}" + (" (pods: logs/pods)" if pod_logs else ""))
    console.print("\n".join(lines))
    if demo.failures:
        console.print(f"[red]{len(demo.failures)} expectation(s) failed:[/red]")
        for failure in demo.failures:
            console.print(f"  - {failure}")
        return 1
    console.print(f"[green]every expectation held: {held}[/green]")
    return 0


def shower(console: Console) -> Show:
    """Prints a heading and a tool's output as they are: no markup, no wrapping. Printed on the
    console of a rich Live display, it appears above the display."""

    def show(heading: str, text: str) -> None:
        console.print(Text(heading, style="bold cyan"), soft_wrap=True)
        if text:
            console.print(Text(text.rstrip("\n")), soft_wrap=True)

    return show


def changes_table(summary: dict[str, Any]) -> Table:
    table = Table(
        title=f"train: {summary['steps']} steps, {summary['steps_lost']} lost",
        caption="stop step per rank: the step each rank saved before the change",
    )
    for column in (
        "membership change",
        "world",
        "stop step per rank",
        "resumed at",
        "lost",
        "time to resume",
    ):
        table.add_column(column)
    for row in summary["changes"]:
        stops = row["stop_steps"]
        table.add_row(
            str(row["cause"]),
            str(row["world"]),
            " ".join(f"{pod.rsplit('-', 1)[0]}:{step}" for pod, step in stops.items()) or "-",
            str(row["resumed_at_step"]),
            str(row["steps_lost"]),
            f"{row['time_to_resume_s']} s",
        )
    return table


def write_torch_timeline(demo: Any, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    if demo.samples:
        times = [t for t, _ in demo.samples]
        for job in ("train", "urgent"):
            ax.step(times, [s.get(job, 0) for _, s in demo.samples], where="post", label=job)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("GPUs bound")
    ax.legend(loc="upper left", fontsize="small")
    steps = [(t, s) for t, s, _ in demo.steps if s >= 0]
    if steps:
        twin = ax.twinx()
        twin.plot([t for t, _ in steps], [s for _, s in steps], color="black", linewidth=1)
        twin.set_ylabel("step trained (black)")
    ax.set_title("train: GPUs bound and steps through every membership change")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def render(demo: Demo) -> Group:
    nodes = Table(title="nodes x GPUs", show_lines=False)
    for column in ("node", "state", "GPUs"):
        nodes.add_column(column)
    letters = {name: name[0].upper() for name in demo.jobs}
    for node, state in sorted(demo.node_state.items()):
        jobs = demo.node_pods.get(node, [])
        cells = "".join(letters[j] * 8 for j in jobs).ljust(8, ".")[:8]
        nodes.add_row(node, state, cells)
    gangs = Table(title="gangs")
    for column in ("job", "min", "bound", "max", "step", "lost"):
        gangs.add_column(column)
    for name, job in demo.jobs.items():
        gangs.add_row(
            name, str(job.plan.min), str(job.bound), str(job.plan.max), str(job.step), str(job.lost)
        )
    log = Table(title="events", show_header=False)
    log.add_column("event")
    for line in demo.events[-12:]:
        log.add_row(line)
    return Group(gangs, nodes, log)


def beat_lines(beats: dict[str, Any]) -> list[str]:
    """The early warning and the reclaim, in words, from what happened."""
    lines = []
    warned = beats.get("early_warning")
    if warned and "notice_at_s" in warned:
        lines.append(
            f"early warning: {warned['warning']} on {warned['node']} at {warned['warned_at_s']} s; "
            f"{', '.join(warned['moved']) or 'nothing'} moved (gone by {warned['left_by_s']} s, "
            f"replaced on {', '.join(sorted(set(warned['replacements'].values()))) or '-'}); "
            f"its termination notice at {warned['notice_at_s']} s found "
            f"{warned['workers_on_node_at_its_notice']} worker(s) there"
        )
    taken = beats.get("least_loss")
    if taken:
        ages = taken["checkpoint_age_at_submit_s"]
        victims = taken["victims"]
        took = [f"{pod} ({job}, checkpoint {ages[job]} s old)" for pod, job in victims.items()]
        spared = [
            f"{job} (checkpoint {'none' if age is None else f'{age} s old'})"
            for job, age in ages.items()
            if job not in victims.values()
        ]
        lines.append(
            f"reclaim by least loss: took {', '.join(took)}; spared {', '.join(spared) or 'none'}"
        )
    return lines


def summary_table(rows: list[dict[str, object]]) -> Table:
    table = Table(title="summary")
    for column in (
        "job",
        "min..max",
        "steps",
        "steps lost",
        "time below target",
        "replacements",
        "replacement latency p50 / max",
    ):
        table.add_column(column)
    for row in rows:
        latency = (
            f"{row['replacement_latency_p50_s']} s / {row['replacement_latency_max_s']} s"
            if row["replacements"]
            else "-"
        )
        table.add_row(
            str(row["job"]),
            f"{row['min']}..{row['max']}",
            str(row["steps"]),
            str(row["steps_lost"]),
            f"{row['time_below_target_s']} s",
            str(row["replacements"]),
            latency,
        )
    return table


def write_timeline(demo: Demo, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times = [t for t, _ in demo.samples]
    fig, ax = plt.subplots(figsize=(10, 4))
    if times:
        series = [[s.get(job, 0) for _, s in demo.samples] for job in demo.jobs]
        ax.stackplot(times, series, labels=list(demo.jobs), step="post")
    ax.set_xlabel("seconds since start (compressed time)")
    ax.set_ylabel("GPUs bound")
    ax.set_title("GPUs per job")
    ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())
