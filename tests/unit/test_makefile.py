"""``make test`` as the README runs it."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _dry_run(checkout: Path, *settings: str) -> list[str]:
    """The commands ``make test`` runs in ``checkout`` (a dry run: nothing is built)."""
    shutil.copy(ROOT / "Makefile", checkout / "Makefile")
    dry = subprocess.run(
        ["make", "-n", "--assume-old=.venv/.installed", *settings, "test"],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    )
    return dry.stdout.splitlines()


def _run_folder(commands: list[str]) -> str:
    """The run's folder, as the shell will expand it (the time it starts)."""
    pytest = next(line for line in commands if " -m pytest " in line)
    assert " --basetemp=" in pytest, f"make test lets pytest pick a shared folder: {pytest}"
    folder = pytest.split(" --basetemp=", 1)[1].strip()  # the last option
    expanded = subprocess.run(
        ["sh", "-c", f"echo {folder}"], capture_output=True, text=True, check=True
    )
    return expanded.stdout.strip()


def test_each_checkout_runs_its_tests_in_a_temporary_folder_of_its_own(tmp_path: Path) -> None:
    # In pytest's shared /tmp/pytest-of-USER, a session that ends deletes all but the last three
    # sessions' folders, one still in use included: a second run on the machine deleted the
    # first one's devclusters under it. Each checkout gets its own folders instead.
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    first, second = _run_folder(_dry_run(one)), _run_folder(_dry_run(two))
    assert first.rsplit("-", 1)[0] != second.rsplit("-", 1)[0]
    assert "pytest-of-" not in first + second
    # The unix sockets tests make under it were sized for pytest's own folder
    # (/tmp/pytest-of-root/pytest-NN): the demo's socket, about 70 characters below it, passed
    # the 107-byte limit under a longer one.
    assert len(first) <= len("/tmp/pytest-of-root/pytest-99")


def test_a_run_starts_in_a_new_folder_and_the_last_three_runs_are_kept(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    prefix = tmp_path / "runs"
    for started in (1700000001, 1700000002, 1700000003, 1700000004):
        (tmp_path / f"runs-{started}" / "popen-gw0").mkdir(parents=True)
    commands = _dry_run(checkout, f"TEST_TMP={prefix}")
    folder = Path(_run_folder(commands))
    for line in commands[: commands.index(next(c for c in commands if " -m pytest " in c))]:
        if str(prefix) in line:
            subprocess.run(["sh", "-c", line], check=True)
    assert folder.parent == tmp_path
    assert folder.name.startswith("runs-")
    assert int(folder.name.removeprefix("runs-")) >= int(time.time()) - 60
    assert not folder.exists()  # pytest makes it: a new one for each run
    kept = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("runs-"))
    assert kept == ["runs-1700000003", "runs-1700000004"]
