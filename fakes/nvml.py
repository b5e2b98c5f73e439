"""Builds the fake ``libnvidia-ml.so.1`` (``fake_nvml.c``) that the real pynvml loads in tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_nvml.c")


def build(out_dir: Path) -> Path:
    """Compile into ``out_dir``; returns the directory to put on ``LD_LIBRARY_PATH``."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise FileNotFoundError("no C compiler (gcc or cc) on PATH")
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / "libnvidia-ml.so.1"
    subprocess.run(
        [
            gcc,
            "-shared",
            "-fPIC",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            str(lib),
            str(SOURCE),
        ],
        check=True,
        capture_output=True,
    )
    return out_dir
