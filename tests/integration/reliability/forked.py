"""``python -m scheduler`` restarted without starting an interpreter and importing the program
every time: each process is forked from a process that imported the scheduler once (a zygote),
then runs ``python -m scheduler``'s ``main`` with the arguments a test gives. For a test that
kills and restarts the scheduler dozens of times; what it tests begins at ``main``, as the command
does (the zygote only imports: it holds no state, threads or connections to share).

:class:`Forked` is the process as ``subprocess.Popen`` shows one (``poll``, ``wait``, ``kill``,
``send_signal``, ``pid``, ``returncode``), so that a ``SchedulerProcess`` can hold it. The zygote
reaps what it forked and writes each exit status next to the process's log (``LOG.exit``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

#: The zygote: imports the program (``scheduler.app`` imports every part), then forks one
#: process per line on stdin (``{"argv", "log", "cwd"}``) and answers its pid.
ZYGOTE = r"""
import json, os, runpy, signal, sys
import scheduler.app

logs = {}

def reap(*_):
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        log = logs.pop(pid, None)
        if log is not None:
            with open(log + ".exit.tmp", "w") as f:
                f.write(str(os.waitstatus_to_exitcode(status)))
            os.replace(log + ".exit.tmp", log + ".exit")

signal.signal(signal.SIGCHLD, reap)
for line in sys.stdin:
    request = json.loads(line)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
            os.chdir(request["cwd"])
            null = os.open(os.devnull, os.O_RDONLY)
            out = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            sys.stdin = open(0, closefd=False)
            sys.stdout = open(1, "w", buffering=1, closefd=False)
            sys.stderr = open(2, "w", buffering=1, closefd=False)
            sys.argv = ["scheduler", *request["argv"]]
            runpy.run_module("scheduler", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    logs[pid] = request["log"]
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
    print(pid, flush=True)
"""


class Forked:
    """A forked scheduler process, as much of ``subprocess.Popen`` as the tests use."""

    def __init__(self, pid: int, log: Path) -> None:
        self.pid = pid
        self.args = [str(log)]
        self.returncode: int | None = None
        self._exit = log.with_name(log.name + ".exit")

    def poll(self) -> int | None:
        if self.returncode is None and self._exit.exists():
            self.returncode = int(self._exit.read_text())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.005)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # gone: its status is on its way
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """Forks scheduler processes from one that has imported the program."""

    def __init__(self, cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=cwd,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            text=True,
        )

    def start(self, argv: list[str], log: Path, cwd: Path) -> Forked:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        request = {"argv": argv, "log": str(log), "cwd": str(cwd)}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the zygote exited with {self.proc.wait()}")
        return Forked(int(answer), log)

    def close(self) -> None:
        """Stop the zygote (stop what it forked first: it reaps them)."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
