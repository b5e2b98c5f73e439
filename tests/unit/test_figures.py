"""The reliability figures are complete when the suite runs on several xdist workers: each
worker hands its own back, and the controller prints and saves them all."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import figures

TESTS = Path(__file__).resolve().parent.parent

RECORDING = """
import pytest

from tests import figures


@pytest.mark.parametrize("i", range(8))
def test_records(i: int) -> None:
    figures.record(f"section {i % 2}", f"figure {i}", i)
"""


def test_figures_from_another_process_are_merged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(figures, "_FIGURES", {})
    figures.record("faults", "kills", 3)
    figures.record("faults", "seconds", 1.5)
    text = figures.dumped()
    monkeypatch.setattr(figures, "_FIGURES", {"faults": {"restarts": 2}})
    figures.merge(text)
    figures.merge(figures.dumped())  # the same worker twice keeps one value each
    assert figures.recorded() == {"faults": {"restarts": 2, "kills": 3, "seconds": 1.5}}


def test_every_workers_figures_are_printed_and_saved(tmp_path: Path) -> None:
    package = tmp_path / "tests"
    package.mkdir()
    for name in ("__init__.py", "conftest.py", "figures.py"):
        shutil.copy(TESTS / name, package / name)
    (package / "test_recording.py").write_text(RECORDING)
    out = tmp_path / "reliability.json"
    env = {**os.environ, "SHOAL_RELIABILITY_OUT": str(out)}
    env.pop("PYTEST_XDIST_WORKER", None)
    run = subprocess.run(
        # Its own temporary folder: a session in pytest's shared one would delete the folders
        # of other sessions on the machine when it ends (the Makefile's TEST_TMP).
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "-p",
            "no:cacheprovider",
            f"--basetemp={tmp_path / 'run'}",
            "tests",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    expected = {
        "section 0": {f"figure {i}": i for i in (0, 2, 4, 6)},
        "section 1": {f"figure {i}": i for i in (1, 3, 5, 7)},
    }
    assert json.loads(out.read_text()) == expected
    assert "reliability figures" in run.stdout
    assert all(f"  figure {i}: {i}" in run.stdout for i in range(8))
