"""The demo doubles as an end-to-end test: the short story on 8 nodes must hold every promise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_short_demo_keeps_every_promise(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    result = subprocess.run(
        [sys.executable, "-m", "demo", "--nodes", "8", "--no-live", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failures"] == []
    jobs = {row["job"]: row for row in summary["jobs"]}
    assert set(jobs) == {"llama", "bert", "urgent"}
    assert all(row["steps_lost"] == 0 for row in jobs.values())
    # The revocation and the reclaim each cost the two elastic jobs members that came back.
    assert jobs["llama"]["replacements"] >= 1
    assert jobs["bert"]["replacements"] >= 1
    assert any("spot revocation" in line for line in summary["events"])
    assert any("urgent admitted" in line for line in summary["events"])
    assert (out / "timeline.png").stat().st_size > 0
