"""The run's outputs: ``summary.json`` and PNG plots (when matplotlib is installed)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scheduler.simulate.engine import Result


def write(results: Sequence[Result], out: Path, inputs: dict[str, Any]) -> list[Path]:
    """Write the summary and plots into ``out``; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        "inputs": inputs,
        "runs": [r.summary() for r in results],
    }
    path = out / "summary.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    written = [path]
    written.extend(_plots(results, out))
    return written


#: The columns of :func:`table`: header, summary key, unit.
_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("GPU alloc", "gpu_allocation_mean", ""),
    ("alloc while jobs wait", "gpu_allocation_while_jobs_wait", ""),
    ("frag while jobs wait", "fragmentation_while_jobs_wait", ""),
    ("wait mean", "job_wait_mean_s", "s"),
    ("wait p99", "job_wait_p99_s", "s"),
    ("JCT mean", "jct_mean_s", "s"),
    ("makespan", "makespan_s", "s"),
    ("gangs in 1 rack", "gangs_in_one_rack", ""),
    ("... when possible", "gangs_in_one_rack_when_possible", ""),
    ("pods in 1 island when possible", "multi_gpu_pods_in_one_island_when_possible", ""),
    ("reclaimed pods", "reclaimed_pods", ""),
    ("revocations hitting jobs", "revocations_affecting_jobs", ""),
    ("GPU-h lost", "lost_gpu_hours", ""),
    ("lost GPU-s per hit", "lost_gpu_seconds_per_revocation", ""),
    ("downtime s per hit", "downtime_seconds_per_revocation", ""),
)


def table(results: Sequence[Result]) -> str:
    """The comparison as a Markdown table, one row per run (what the CLI prints)."""
    header = ["policy", "checkpoints", *(c[0] for c in _COLUMNS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in results:
        s = r.summary()
        cells = [
            r.policy,
            "on notice" if r.settings.checkpoint_on_notice else "periodic only",
            *(_cell(s[key], unit) for _, key, unit in _COLUMNS),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: The columns of :func:`loss_table`: header, summary key, unit.
_LOSS_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("goodput", "goodput", ""),
    ("GPU-h lost", "lost_gpu_hours_total", ""),
    ("... to revocations", "lost_gpu_hours", ""),
    ("... to reclaims", "reclaim_lost_gpu_hours", ""),
    ("... to torn releases", "torn_released_lost_gpu_hours", ""),
    ("... to moves", "moved_lost_gpu_hours", ""),
    ("revocations hitting jobs", "revocations_affecting_jobs", ""),
    ("quorum revocations", "quorum_revocations", ""),
    ("revoked pods (surplus)", "revoked_pods", ""),
    ("reclaimed pods", "reclaimed_pods", ""),
    ("moved pods", "moved_pods", ""),
    ("JCT mean", "jct_mean_s", "s"),
    ("makespan", "makespan_s", "s"),
)


def loss_table(results: Sequence[Result]) -> str:
    """What each run lost on spot, as a Markdown table: goodput (full-size work done over
    GPU-seconds bound), GPU-hours lost by cause, revocations that took a gang below its minimum."""
    header = ["policy", "features", "notice", *(c[0] for c in _LOSS_COLUMNS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in results:
        s = r.summary()
        notice = f"{r.settings.notice_seconds:g} s"
        if not r.settings.checkpoint_on_notice:
            notice += " (ignored)"
        cells = [r.policy, r.settings.label(), notice]
        for _, key, unit in _LOSS_COLUMNS:
            cell = _cell(s[key], unit)
            if key == "revoked_pods":
                cell = f"{cell} ({s['revoked_surplus_pods']})"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(value: object, unit: str) -> str:
    """One table cell: "-" for no value, seconds in a readable unit, floats rounded."""
    if value is None:
        return "-"
    if unit == "s" and isinstance(value, int | float):
        return _duration(float(value))
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def _duration(seconds: float) -> str:
    """Seconds in the largest unit that still reads as two or more of it (days, hours, minutes)."""
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} d"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def _plots(results: Sequence[Result], out: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is a dev dependency
        return []
    written = []
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for r in results:
        label = r.policy + ("" if r.settings.checkpoint_on_notice else " (periodic ckpt)")
        hours = [s[0] / 3600 for s in r.samples]
        top.plot(hours, [s[1] for s in r.samples], label=label, linewidth=1)
        bottom.plot(hours, [s[2] for s in r.samples], label=label, linewidth=1)
    top.set_ylabel("GPU allocation")
    top.set_ylim(0, 1.05)
    top.legend(loc="lower right", fontsize="small")
    bottom.set_ylabel("fragmentation")
    bottom.set_xlabel("simulated hours")
    bottom.set_ylim(0, 1.05)
    fig.tight_layout()
    path = out / "allocation.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    fig, ax = plt.subplots(figsize=(10, 4))
    for r in results:
        label = r.policy + ("" if r.settings.checkpoint_on_notice else " (periodic ckpt)")
        waits = sorted(j["wait"] / 60 for j in r.jobs if j["wait"] is not None)
        if waits:
            ax.plot(waits, [(i + 1) / len(waits) for i in range(len(waits))], label=label)
    ax.set_xlabel("job wait (minutes)")
    ax.set_ylabel("share of jobs")
    ax.set_xscale("symlog")
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    path = out / "wait-cdf.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written
