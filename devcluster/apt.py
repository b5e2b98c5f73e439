"""Debian packages installed by the project's own tooling (the browser for the web view's
tests, Slurm for the Slurm tests): one apt-get line, its archives kept in a cache folder."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from devcluster.versions import cache_root


def install(archives: Path | str, *packages: str) -> int:
    """``apt-get install`` of ``packages`` with their archives in ``archives``; the exit code."""
    command = [
        "apt-get",
        "install",
        "-y",
        "-qq",
        "--no-install-recommends",
        "-o",
        f"Dir::Cache::archives={archives}",
        # The cache is root's: apt's download user could not write there.
        "-o",
        "APT::Sandbox::User=root",
        *packages,
    ]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(command, env=env, check=False).returncode


def ensure(
    packages: Sequence[str], reason: str, *, what: str, prefix: str, say: Callable[[str], None]
) -> str | None:
    """Install ``packages`` (what ``reason`` says is missing) as root, their archives kept in the
    cache beside the control plane's binaries (``<cache>/apt``), reading the package lists once
    when the first try fails (a fresh machine has none). None when installed; else why not,
    ``reason`` first. ``what`` names the install in the message when root is needed, ``prefix``
    starts the progress line."""
    if not shutil.which("apt-get"):
        return f"{reason}; apt-get is not available here"
    if os.geteuid() != 0:
        return f"{reason}; installing {what} needs root"
    archives = cache_root() / "apt"
    (archives / "partial").mkdir(parents=True, exist_ok=True)
    say(f"{prefix}: installing Debian's {', '.join(packages)} (packages kept in {archives})")
    if install(archives, *packages) != 0:
        subprocess.run(["apt-get", "update", "-qq"], check=False)
        if install(archives, *packages) != 0:
            return f"{reason}; `apt-get install {' '.join(packages)}` failed"
    return None
