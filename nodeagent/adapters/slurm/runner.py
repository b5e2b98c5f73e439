"""Where the Slurm adapter's commands run: one small injectable runner.

Every ``scontrol`` call goes through a :class:`Runner` (argv in, :class:`Result` out), so unit
tests hand the adapter a fake one and check the exact argv, and the real one
(:func:`run_command`) is the only place a process is started. A runner never raises for a
command that failed: the exit status and output are the result; a command that cannot be
started or runs past its time limit is a failed result too (exit 127 or 124, the shell's codes).
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class SlurmError(Exception):
    """A Slurm command failed (the root of the adapter's error tree); names the argv and what
    it printed."""


@dataclass(frozen=True, slots=True)
class Result:
    """One finished command."""

    argv: tuple[str, ...]
    code: int
    out: str = ""
    err: str = ""

    @property
    def ok(self) -> bool:
        return self.code == 0

    def error(self) -> SlurmError:
        said = (self.err or self.out).strip().splitlines()
        return SlurmError(f"{' '.join(self.argv)}: exit {self.code}: {said[-1] if said else ''}")


class Runner(Protocol):
    """Runs one command and waits for it (blocking: the agent calls it off its event loop)."""

    def __call__(self, argv: Sequence[str]) -> Result: ...


#: Seconds a Slurm command may take (slurmctld answers in milliseconds when it is up).
TIMEOUT = 20.0


def run_command(argv: Sequence[str], timeout: float = TIMEOUT) -> Result:
    """Run ``argv`` (no shell), its output as text."""
    args = tuple(argv)
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        return Result(args, 127, "", f"{args[0]}: not found ({exc.strerror})")
    except subprocess.TimeoutExpired:
        return Result(args, 124, "", f"no answer within {timeout:g} s")
    return Result(args, done.returncode, done.stdout, done.stderr)
