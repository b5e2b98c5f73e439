"""What ``resume()`` picks and what the leave-by file means, without starting any process."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

pytest.importorskip("torch")

from shoal_worker.distributed import latest_checkpoint, read_leave_by


def test_resume_skips_a_checkpoint_whose_save_did_not_finish(tmp_path: Path) -> None:
    for step in (3, 12):
        (tmp_path / f"step-{step}").mkdir()
        (tmp_path / f"step-{step}" / ".metadata").write_bytes(b"x")
    torn = tmp_path / "step-20"
    torn.mkdir()
    (torn / "__0_0.distcp").write_bytes(b"shard of one rank")
    (tmp_path / "step-x").mkdir()

    assert latest_checkpoint(tmp_path) == (12, tmp_path / "step-12")
    assert latest_checkpoint(tmp_path / "missing") is None


def test_the_leave_by_file_is_a_notice_once_it_holds_anything(tmp_path: Path) -> None:
    path = tmp_path / "leave-by"
    assert read_leave_by(str(path)) is None  # not mounted
    path.write_text("")
    assert read_leave_by(str(path)) is None  # the annotation is not set
    path.write_text("2026-12-01T02:30:00Z\n")
    notice = read_leave_by(str(path))
    assert notice is not None
    assert notice.leave
    assert notice.leave_by == datetime(2026, 12, 1, 2, 30, tzinfo=UTC)
    path.write_text("soon")
    unreadable = read_leave_by(str(path))
    assert unreadable is not None
    assert unreadable.leave
    assert unreadable.leave_by is None
