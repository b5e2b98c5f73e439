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
