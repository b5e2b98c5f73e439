"""The torch story's summary is computed from what the ranks recorded and what the checkpoint
folder holds: a change that lost steps or tore the stop shows as such."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from demo.torchstory import changes


def rec(event: str, t: float, pod: str, **fields: Any) -> dict[str, Any]:
    return {"event": event, "t": t, "pod": pod, **fields}


def saved(ckpt: Path, step: int) -> None:
    (ckpt / f"step-{step}").mkdir(parents=True)
    (ckpt / f"step-{step}" / ".metadata").write_text("")


def history(stop_b: int, resume: int) -> list[dict[str, Any]]:
    """Two pods train steps 0..5 in world 2; a notice stops a at 5 and b at ``stop_b``; b alone
    resumes at ``resume``."""
    records = [rec("start", 0.0, p, step=0, world=2) for p in "ab"]
    records += [rec("step", 1.0 + s, p, step=s, world=2) for s in range(6) for p in "ab"]
    records += [rec("stop", 7.0, "a", step=5, leaving=True), rec("stop", 7.1, "b", step=stop_b)]
    records += [rec("start", 9.0, "b", step=resume, world=1)]
    records += [rec("step", 10.0 + s, "b", step=resume + s, world=1) for s in range(3)]
    return records


def test_a_clean_change_loses_nothing_and_times_the_resume(tmp_path: Path) -> None:
    saved(tmp_path, 5)
    [change] = changes(history(5, 6), tmp_path, [(0.5, "grow"), (6.5, "spot notice")])
    assert change.cause == "spot notice"
    assert (change.world_before, change.world_after) == (2, 1)
    assert change.stops == {"a": 5, "b": 5}
    assert change.checkpoint_complete
    assert change.lost == 0
    assert change.resume_s == 10.0 - 7.1


def test_steps_trained_past_the_checkpoint_count_as_lost(tmp_path: Path) -> None:
    saved(tmp_path, 3)
    [change] = changes(history(5, 4), tmp_path, [])
    assert change.lost == 2
    assert change.checkpoint_complete


def test_a_torn_stop_and_a_missing_checkpoint_show(tmp_path: Path) -> None:
    [change] = changes(history(4, 6), tmp_path, [])
    assert set(change.stops.values()) == {4, 5}
    assert not change.checkpoint_complete
