"""Leaving after an orderly stop: the exit handlers run, what was printed is flushed, the status
is the program's, and a daemon thread still blocked in a read does not hold the exit up."""

from __future__ import annotations

import os
import signal
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


EARLY = textwrap.dedent(
    """
    import asyncio, time
    from common.leave import hear_stop, leave, stop_asked, stop_on_signal

    hear_stop()
    print("starting", flush=True)
    deadline = time.monotonic() + 60  # still starting when the SIGTERM comes
    while not stop_asked() and time.monotonic() < deadline:
        time.sleep(0.01)

    async def serve():
        done = asyncio.Event()
        stop_on_signal(asyncio.get_running_loop(), done.set)
        await done.wait()

    asyncio.run(serve())
    print("stopped", flush=True)
    leave(0)
    """
)


def _child_of(parent: int) -> int | None:
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    return int(children[0]) if children else None


def test_a_sigterm_while_starting_as_pid_1_is_carried_out_once_up() -> None:
    """As PID 1 (a container's first process, here in a new PID namespace) a process ignores a
    signal it has no handler for: a SIGTERM that comes while the program still starts must be
    remembered, then carried out as soon as the program serves, exiting 0."""
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c", EARLY],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "starting\n"
        child = _child_of(proc.pid)
        assert child is not None
        os.kill(child, signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out == "stopped\n"
