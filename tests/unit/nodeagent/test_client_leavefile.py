"""The worker's fallback when the agent's socket is absent: the pod's ``shoal.dev/leave-by`` as a
Downward API file. ``wait`` returns once the file holds a time, and only then."""

from __future__ import annotations

import json
import os
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from shoal_worker.cli import main
from shoal_worker.leavefile import read_leave_by

LEAVE_BY = "2026-11-30T10:02:00Z"


def replace_file(path: Path, text: str) -> None:
    """As the kubelet updates a Downward API file: a whole new file swapped in."""
    fresh = path.with_name(path.name + ".new")
    fresh.write_text(text)
    os.replace(fresh, path)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, None),  # not mounted
        ("", None),  # the annotation is absent
        ("soon", None),  # not a time
        (LEAVE_BY, datetime(2026, 11, 30, 10, 2, tzinfo=UTC)),
    ],
)
def test_the_file_holds_a_time_or_nothing(
    tmp_path: Path, content: str | None, expected: datetime | None
) -> None:
    path = tmp_path / "leave-by"
    if content is not None:
        path.write_text(content)
    assert read_leave_by(path) == expected


def args(tmp_path: Path, leave_by: Path) -> list[str]:
    return [
        "--namespace",
        "train",
        "--name",
        "worker-0",
        "--uid",
        "u-0",
        "--socket",
        str(tmp_path / "absent.sock"),
        "--leave-by-file",
        str(leave_by),
        "wait",
    ]


def test_wait_without_a_socket_returns_once_the_kubelet_writes_the_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "leave-by"
    path.write_text("")
    writer = threading.Timer(1.5, replace_file, args=(path, LEAVE_BY))
    writer.start()
    try:
        assert main(args(tmp_path, path)) == 0
    finally:
        writer.join()
    out, err = capsys.readouterr()
    printed = json.loads(out)
    assert printed["source"] == "leave-by-file"
    assert datetime.fromisoformat(printed["leave_by"]) == datetime(2026, 11, 30, 10, 2, tzinfo=UTC)
    assert "no agent socket" in err


def test_wait_with_the_socket_there_asks_the_agent_not_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "leave-by"
    path.write_text(LEAVE_BY)
    (tmp_path / "absent.sock").write_text("")  # a socket path that no agent answers on
    assert main(args(tmp_path, path)) == 4
    out, _ = capsys.readouterr()
    assert out == ""
