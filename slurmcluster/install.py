"""Debian's Slurm packages: whether this machine has them, and installing them when it may.

``missing`` names the programs a cluster needs that are not installed; ``ensure`` installs
Debian's ``slurmctld``, ``slurmd``, ``slurm-client`` and ``munge`` when any is missing and this
process may (root, with apt-get), keeping the downloaded packages in the devcluster's cache
(``~/.cache/shoal/devcluster/apt``) so that a machine that lost them installs them again
without downloading. Installing starts no service: the packages' scripts ask ``invoke-rc.d``,
which starts nothing on a machine without an init system (or with a ``policy-rc.d`` that says
no); the cluster runs its own daemons with its own files (``slurmcluster/cluster.py``).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from typing import Final

from devcluster import apt

Say = Callable[[str], None]

#: The Debian packages, and the programs a cluster runs from them.
PACKAGES: Final = ("slurmctld", "slurmd", "slurm-client", "munge")
PROGRAMS: Final = (
    "slurmctld",
    "slurmd",
    "slurmstepd",
    "sbatch",
    "srun",
    "scontrol",
    "squeue",
    "sinfo",
    "scancel",
    "munged",
)
#: What else starting a cluster calls (util-linux and iproute2, in every Debian).
TOOLS: Final = ("ip", "nsenter", "unshare", "setpriv")


class InstallError(Exception):
    """The packages are missing and cannot be installed here; the message says why."""


def _say(message: str) -> None:
    print(message, flush=True)


def missing() -> list[str]:
    """The programs a cluster needs that are not on PATH (Slurm's are in /usr/sbin too)."""
    path = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"
    return [p for p in PROGRAMS if shutil.which(p, path=path) is None]


def unavailable() -> str | None:
    """Why this machine cannot start a Slurm cluster, or None when it can."""
    if os.geteuid() != 0:
        return "a Slurm cluster needs root (network namespaces, Slurm's daemons as root)"
    tools = [t for t in TOOLS if shutil.which(t) is None]
    if tools:
        return f"{', '.join(tools)} not installed"
    programs = missing()
    if programs:
        return f"Slurm is not installed ({', '.join(programs)} missing): run `make slurm` as root"
    return None


def ensure(*, say: Say = _say) -> float:
    """Install the packages when a program is missing; the seconds it took (0 when nothing was
    missing). :class:`InstallError` when they are missing and cannot be installed."""
    absent = missing()
    if not absent:
        return 0.0
    reason = f"{', '.join(absent)} not installed"
    started = time.monotonic()
    why = apt.ensure(PACKAGES, reason, what="Debian's Slurm", prefix="slurmcluster", say=say)
    if why:
        raise InstallError(why)
    absent = missing()
    if absent:
        raise InstallError(f"installed {' '.join(PACKAGES)} but {', '.join(absent)} still missing")
    took = time.monotonic() - started
    say(f"slurmcluster: installed in {took:.0f} s")
    return took
