"""Leaving after an orderly stop: the exit handlers run, what was printed is flushed, the status
is the program's, and a daemon thread still blocked in a read does not hold the exit up."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import atexit, socket, sys, threading
    from pathlib import Path
    from common.leave import leave

    reader, writer = socket.socketpair()
    threading.Thread(target=reader.recv, args=(1,), daemon=True).start()  # blocked for good
    atexit.register(Path(sys.argv[1]).write_text, "exit handlers ran")
    print("said before leaving", end="")  # buffered: stdout is a pipe
    leave(7)
    print("never printed")
    """
)


def test_leave_runs_the_exit_handlers_flushes_and_exits_with_the_status(tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(mark)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert done.returncode == 7, done.stderr
    assert done.stdout == "said before leaving"
    assert mark.read_text() == "exit handlers ran"
