"""The demo doubles as an end-to-end test: each story must hold every promise it shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.waiting import TRAINING_TIMEOUT, eventually

LIVE_VIEW = "Live view: "


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


#: pytest-timeout for the simulated story: about 2 minutes on a quiet 2-core machine, past the
#: suite's 600 s beside another test run (load average 15-30).
SIMULATED_TIMEOUT = 1200


def run_demo(out: Path, *args: str, limit: float) -> dict[str, Any]:
    """Runs the demo to its end; while it runs, the web view address it prints must answer.
    A demo still running a minute before the test's ``limit`` is killed, so that its output
    (what it was waiting for) is in the failure rather than pytest-timeout's stack."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    lines: list[str] = []
    answered: list[str] = []
    with subprocess.Popen(
        [sys.executable, "-m", "demo", "--no-live", "--out", str(out), *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    ) as proc:
        watchdog = threading.Timer(limit - 60, proc.kill)
        watchdog.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if line.startswith(LIVE_VIEW) and not answered:
                    answered.append(line.removeprefix(LIVE_VIEW).strip())
                    eventually(
                        lambda: _answers(answered[0]),
                        timeout=60,
                        what=f"GET {answered[0]} to answer 200",
                    )
        except BaseException:
            proc.kill()  # a failed check ends the demo too
            raise
        finally:
            watchdog.cancel()
        code = proc.wait()
    output = "".join(lines)
    assert code == 0, output[-8000:]
    assert len(answered) == 1, output[-8000:]
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    assert summary["failures"] == []
    assert summary["web_view"] == answered[0]
    assert (out / "timeline.png").stat().st_size > 0
    # Each snapshot is in the output as it was saved.
    for view in summary["views"]:
        assert (out / view["file"]).read_text().rstrip() in output, view
    return summary


def gangs_bound(out: Path, summary: dict[str, Any]) -> dict[str, dict[str, int]]:
    """For each saved ``kubectl shoal gangs`` snapshot (by its file name's moment): the BOUND
    column by gang name."""
    found = {}
    for view in summary["views"]:
        header, *rows = (out / view["file"]).read_text().splitlines()
        columns = header.split()
        assert columns[:5] == ["NAME", "SOURCE", "MIN", "BOUND", "MAX"], header
        moment = Path(view["file"]).stem.split("-", 1)[1]
        found[moment] = {row.split()[0]: int(row.split()[3]) for row in rows}
    return found


@pytest.mark.timeout(TRAINING_TIMEOUT)
def test_the_torch_story_stops_every_rank_at_one_step_and_loses_nothing(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    summary = run_demo(tmp_path / "demo", limit=TRAINING_TIMEOUT)
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
    # `kubectl shoal gangs` at each key moment: the gang at its minimum, still at its minimum
    # after the spot notice took a member and after the reclaim (urgent bound), and regrown.
    views = gangs_bound(tmp_path / "demo", summary)
    assert list(views) == ["admitted", "spot-notice", "reclaimed", "end"]
    assert views["admitted"]["train"] == 2
    assert views["spot-notice"]["train"] == 2
    assert views["reclaimed"] == {"train": 2, "urgent": 1}
    assert views["end"]["train"] == 3


@pytest.mark.timeout(SIMULATED_TIMEOUT)
def test_the_simulated_story_keeps_every_promise(tmp_path: Path) -> None:
    summary = run_demo(
        tmp_path / "demo", "--workers", "simulated", "--nodes", "8", limit=SIMULATED_TIMEOUT
    )
    # Each node's agent kept its pod file in the demo's folder, one file per node: the default
    # folder is a real node's hostPath on this machine, which a root agent's file made
    # unreadable to the chart's agent (a real-node test's worker was drained for it).
    state = tmp_path / "demo" / "state"
    nodes = sorted(p.parent.name for p in state.glob("*/pods.json"))
    assert nodes
    for node in nodes:
        assert f'"node":"{node}"' in (state / node / "pods.json").read_text(), node
    jobs = {row["job"]: row for row in summary["jobs"]}
    assert set(jobs) == {"llama", "bert", "urgent"}
    assert all(row["steps_lost"] == 0 for row in jobs.values())
    # The early warning and the revocation each cost the two elastic jobs a member that came
    # back.
    assert jobs["llama"]["replacements"] >= 1
    assert jobs["bert"]["replacements"] >= 1
    assert any("spot revocation" in line for line in summary["events"])
    assert any("urgent admitted" in line for line in summary["events"])
    # A rebalance recommendation on a spot node moved its surplus worker before any notice:
    # gone before the node's termination notice, which found none of ours there, and
    # replaced on another node.
    warned = summary["early_warning"]
    assert warned["warning"] == "AWS rebalance recommendation"
    assert len(warned["moved"]) == 1
    assert warned["left_by_s"] < warned["notice_at_s"]
    assert warned["workers_on_node_at_its_notice"] == 0
    assert warned["replacements"]
    assert warned["node"] not in warned["replacements"].values()
    # The urgent job needs one member: the reclaim took it from the job whose checkpoint was
    # newest (the least expected loss), and its Event says so.
    taken = summary["least_loss"]
    (victim_job,) = set(taken["victims"].values())
    (spared_job,) = {"llama", "bert"} - {victim_job}
    ages = taken["checkpoint_age_at_submit_s"]
    assert ages[victim_job] < ages[spared_job]
    events = taken["reclaimed_events"].values()
    assert all("chosen by least expected loss" in text for text in events)
    # `kubectl shoal gangs` at each key moment: 8 nodes, two revoked then replaced by two new.
    views = gangs_bound(tmp_path / "demo", summary)
    assert list(views) == ["admitted", "spot-notice", "reclaimed", "end"]
    assert views["admitted"] == {"llama": 3, "bert": 3}
    assert views["spot-notice"] == {"llama": 3, "bert": 3}
    assert views["reclaimed"] == {victim_job: 2, spared_job: 3, "urgent": 1}
    assert views["end"]["llama"] == 3
    assert views["end"]["bert"] == 3
