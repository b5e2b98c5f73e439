"""``make test`` as the README runs it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pytest_command(checkout: Path) -> str:
    """The pytest line ``make test`` runs in ``checkout`` (a dry run: nothing is built)."""
    shutil.copy(ROOT / "Makefile", checkout / "Makefile")
    dry = subprocess.run(
        ["make", "-n", "--assume-old=.venv/.installed", "test"],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    )
    return next(line for line in dry.stdout.splitlines() if " -m pytest " in line)


def test_each_checkout_runs_its_tests_in_a_temporary_folder_of_its_own(tmp_path: Path) -> None:
    # In pytest's shared /tmp/pytest-of-USER, a session that ends deletes all but the last three
    # sessions' folders, one still in use included: a second run on the machine deleted the
    # first one's devclusters under it. Each checkout gets its own folder instead.
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    first, second = _pytest_command(one), _pytest_command(two)
    folders = []
    for command in (first, second):
        option = [word for word in command.split() if word.startswith("--basetemp=")]
        assert option, f"make test lets pytest pick a shared temporary folder: {command}"
        folders.append(option[0].removeprefix("--basetemp="))
    assert folders[0] != folders[1]
    assert folders[0] == _pytest_command(one).split("--basetemp=")[1].split()[0]
    assert all("pytest-of-" not in folder for folder in folders)
