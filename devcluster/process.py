"""Starting and stopping component processes, and telling whether one is still ours and alive.

Each component runs in its own process group. A recorded pid is trusted only together with the
process start time read from /proc, so a recycled pid is never signalled.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1
#: Components this process started, so stopping one also collects its exit status.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True, slots=True)
class Proc:
    """A started component: enough to recognise it later and to start it again the same way."""

    name: str
    pid: int
    start_ticks: int
    log: str
    argv: tuple[str, ...] = ()
    die_with_parent: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "pid": self.pid,
            "start_ticks": self.start_ticks,
            "log": self.log,
            "argv": list(self.argv),
            "die_with_parent": self.die_with_parent,
        }

    @staticmethod
    def from_json(raw: dict[str, object]) -> Proc:
        pid, ticks, argv = raw["pid"], raw["start_ticks"], raw.get("argv", [])
        if not (isinstance(pid, int) and isinstance(ticks, int) and isinstance(argv, list)):
            raise ValueError(f"malformed process record in the devcluster state: {raw!r}")
        return Proc(
            name=str(raw["name"]),
            pid=pid,
            start_ticks=ticks,
            log=str(raw["log"]),
            argv=tuple(str(a) for a in argv),
            die_with_parent=bool(raw.get("die_with_parent", False)),
        )


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) from /proc/PID/stat, or None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def alive(proc: Proc) -> bool:
    """True while the recorded process runs (a zombie or a recycled pid counts as gone)."""
    stat = _stat(proc.pid)
    return stat is not None and stat[0] not in ("Z", "X") and stat[1] == proc.start_ticks


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(
    name: str, argv: list[str], log: Path, *, die_with_parent: bool
) -> tuple[Proc, subprocess.Popen[bytes]]:
    """Start ``argv`` in a new session with output to ``log``.

    With ``die_with_parent`` the kernel kills the component if the starting process dies (test
    sessions); without it the component outlives the CLI that started it (``devcluster up``).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    command, preexec = list(argv), None
    if die_with_parent:
        # util-linux's setpriv sets the death signal and execs the component, so no Python runs
        # in the forked child: a preexec_fn does, and in a process with gRPC's and other
        # threads it can crash there (a segfault in threading's after-fork hook took a test
        # worker down with it). Without setpriv, the preexec_fn is the fallback.
        setpriv = shutil.which("setpriv")
        if setpriv:
            command = [setpriv, "--pdeathsig", "KILL", "--", *argv]
        else:
            preexec = _die_with_parent
    with log.open("ab") as out:
        popen = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec,  # noqa: PLW1509
        )
    stat = _stat(popen.pid)
    ticks = stat[1] if stat else 0
    _CHILDREN[popen.pid] = popen
    proc = Proc(
        name=name,
        pid=popen.pid,
        start_ticks=ticks,
        log=str(log),
        argv=tuple(argv),
        die_with_parent=die_with_parent,
    )
    return proc, popen


def stop(proc: Proc, *, grace: float = 10.0) -> bool:
    """SIGTERM the component's process group, SIGKILL after ``grace`` seconds.

    Returns True when it is gone.
    """
    if not alive(proc):
        _reap(proc.pid)
        return True
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return True
        except PermissionError:
            os.kill(proc.pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not alive(proc):  # exited (perhaps a zombie until reaped)
                _reap(proc.pid)
                return True
            time.sleep(0.05)
    return not alive(proc)


def _reap(pid: int) -> None:
    """Collect the exit status when the component is our own child, so it is not left a zombie."""
    child = _CHILDREN.pop(pid, None)
    if child is not None:
        child.wait(timeout=5)
        return
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def status_kib(pid: int, field: str) -> int | None:
    """A ``kB`` field of /proc/PID/status (``VmRSS``, ``VmHWM``, ``RssAnon``...); ``None`` when
    the process or the field is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used (from /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(proc: Proc) -> int:
    """Resident memory of the process (0 when it is gone)."""
    if not alive(proc):
        return 0
    return (status_kib(proc.pid, "VmRSS") or 0) * 1024
