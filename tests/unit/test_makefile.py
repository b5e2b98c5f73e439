"""``make test`` as the README runs it."""

from __future__ import annotations

import shutil
import subprocess
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
    pytest = next(line for line in commands if " -m pytest " in line)
    assert " --basetemp=" in pytest, f"make test lets pytest pick a shared folder: {pytest}"
    return pytest.split(" --basetemp=", 1)[1].strip()  # the last option


def test_each_checkout_runs_its_tests_in_a_temporary_folder_of_its_own(tmp_path: Path) -> None:
    # In pytest's shared /tmp/pytest-of-USER, a session that ends deletes all but the last three
    # sessions' folders, one still in use included: a second run on the machine deleted the
    # first one's devclusters under it. Each checkout gets its own folder instead.
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    first, second = _run_folder(_dry_run(one)), _run_folder(_dry_run(two))
    assert Path(first).parent != Path(second).parent
    assert Path(first).parent == Path(_run_folder(_dry_run(one))).parent
    assert "pytest-of-" not in first + second


def test_a_run_starts_in_a_new_folder_and_the_last_three_runs_are_kept(tmp_path: Path) -> None:
    checkout, runs = tmp_path / "checkout", tmp_path / "runs"
    checkout.mkdir()
    for started in (1700000001, 1700000002, 1700000003, 1700000004):
        (runs / str(started) / "popen-gw0").mkdir(parents=True)
    commands = _dry_run(checkout, f"TEST_TMP={runs}")
    folder = _run_folder(commands)
    for line in commands[: commands.index(next(c for c in commands if " -m pytest " in c))]:
        if str(runs) in line:
            subprocess.run(["sh", "-c", line], check=True)
    made = subprocess.run(
        ["sh", "-c", f"echo {folder}"], capture_output=True, text=True, check=True
    )
    assert Path(made.stdout.strip()).parent == runs
    assert not Path(made.stdout.strip()).exists()  # pytest makes it: a new one for each run
    assert sorted(p.name for p in runs.iterdir()) == ["1700000003", "1700000004"]
