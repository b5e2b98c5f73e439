"""Debian packages installed by the project's own tooling (the browser for the web view's
tests, Slurm for the Slurm tests): one apt-get line, its archives kept in a cache folder."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


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
