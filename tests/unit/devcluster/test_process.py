"""Components a test session starts die with it, and no Python runs in their forked child."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from devcluster import process
from tests.waiting import eventually


def _gone(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")


def test_a_component_started_to_die_with_its_parent_dies_when_the_parent_is_killed(
    tmp_path: Path,
) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parents[3])!r})
        from pathlib import Path
        from devcluster import process
        proc, _ = process.spawn("sleeper", ["sleep", "300"], Path({str(tmp_path / "log")!r}),
                                die_with_parent=True)
        print(proc.pid, flush=True)
        time.sleep(300)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        eventually(
            lambda: Path(f"/proc/{child}/cmdline").read_bytes().startswith(b"sleep\0"),
            timeout=30,
            what="the component running",
        )
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        parent.stdout.close()
        eventually(lambda: _gone(child), timeout=30, what="the component gone with its parent")
    finally:
        if not _gone(child):
            os.kill(child, signal.SIGKILL)


def test_no_preexec_function_runs_in_the_child_when_setpriv_is_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, object] = {}
    real = subprocess.Popen

    def record(argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        seen["argv"], seen["preexec_fn"] = argv, kwargs.get("preexec_fn")
        return real(argv, **kwargs)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr(subprocess, "Popen", record)
    proc, popen = process.spawn("true", ["true"], tmp_path / "log", die_with_parent=True)
    popen.wait()
    if shutil.which("setpriv") is None:
        pytest.skip("util-linux's setpriv is not installed here")
    assert seen["preexec_fn"] is None
    assert seen["argv"] == [shutil.which("setpriv"), "--pdeathsig", "KILL", "--", "true"]
    assert proc.argv == ("true",)
