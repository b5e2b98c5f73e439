"""The demo doubles as an end-to-end test: each story must hold every promise it shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def run_demo(out: Path, *args: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    result = subprocess.run(
        [sys.executable, "-m", "demo", "--no-live", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    assert summary["failures"] == []
    assert (out / "timeline.png").stat().st_size > 0
    return summary


def test_the_torch_story_stops_every_rank_at_one_step_and_loses_nothing(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    summary = run_demo(tmp_path / "demo")
    assert summary["workers"] == "torch"
    changes = summary["changes"]
    causes = [change["cause"] for change in changes]
    # Grown from the minimum, a spot notice, regrown, a reclaim, regrown: each one a new round.
    assert causes[0].startswith("grow")
    assert any(cause.startswith("spot notice") for cause in causes)
    assert "reclaim for the urgent gang" in causes
    assert causes[-1] == "regrow: the urgent gang finishes"
    for change in changes:
        # Every rank of the old world stopped at one step and saved it; the new world started
        # right after that complete checkpoint.
        assert len(change["stop_steps"]) == int(change["world"].split(" -> ")[0]), change
        assert len(set(change["stop_steps"].values())) == 1, change
        assert change["checkpoint_complete"], change
        assert change["resumed_at_step"] == change["checkpoint_step"] + 1, change
        assert change["steps_lost"] == 0, change
    notices = [c for c in changes if c["cause"].startswith(("spot", "reclaim"))]
    assert [c["world"] for c in notices] == ["3 -> 2", "3 -> 2"]
    assert summary["steps_lost"] == 0
    assert summary["steps_missing"] == []
    assert summary["steps"] > changes[-1]["resumed_at_step"]


def test_the_simulated_story_keeps_every_promise(tmp_path: Path) -> None:
    summary = run_demo(tmp_path / "demo", "--workers", "simulated", "--nodes", "8")
    jobs = {row["job"]: row for row in summary["jobs"]}
    assert set(jobs) == {"llama", "bert", "urgent"}
    assert all(row["steps_lost"] == 0 for row in jobs.values())
    # The revocation and the reclaim each cost the two elastic jobs members that came back.
    assert jobs["llama"]["replacements"] >= 1
    assert jobs["bert"]["replacements"] >= 1
    assert any("spot revocation" in line for line in summary["events"])
    assert any("urgent admitted" in line for line in summary["events"])
