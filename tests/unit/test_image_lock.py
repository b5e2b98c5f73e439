"""The images install what pyproject.toml asks for, pinned: ``requirements/images.lock`` holds
every runtime dependency at a version its specifier allows, each with hashes, and nothing that no
dependency needs; ``requirements/build.lock`` does the same for the build backend. When a test
here fails, run ``python3 -m devcluster.images lock`` and commit both files."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from devcluster import images

ROOT = Path(__file__).resolve().parents[2]
#: What uv writes for a pin asked for by pyproject.toml itself.
PROJECT = "shoal (pyproject.toml)"
FIX = f"run `{images.LOCK_COMMAND}` and commit requirements/"


@dataclass(frozen=True, slots=True)
class Pin:
    version: str
    hashes: tuple[str, ...]
    via: frozenset[str]


def parse_lock(text: str) -> dict[str, Pin]:
    """``name -> Pin`` from a lock file as uv (or pip-compile) writes it."""
    pins: dict[str, Pin] = {}
    name = ""
    fields: dict[str, tuple[str, list[str], set[str]]] = {}
    for line in text.splitlines():
        pinned = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)", line)
        if pinned:
            name = canonicalize_name(pinned[1])
            fields[name] = (pinned[2], [], set())
        elif name and (digest := re.search(r"--hash=(sha256:[0-9a-f]{64})", line)):
            fields[name][1].append(digest[1])
        elif name and (via := re.match(r"^\s+#\s+(?:via\s+)?(?!via$)(\S.*)$", line)):
            fields[name][2].add(via[1] if via[1] == PROJECT else canonicalize_name(via[1]))
    for key, (version, hashes, needed_by) in fields.items():
        pins[key] = Pin(version, tuple(hashes), frozenset(needed_by))
    return pins


def drift(requirements: list[str], pins: dict[str, Pin]) -> list[str]:
    """Why ``pins`` does not match ``requirements`` (nothing when it does)."""
    problems: list[str] = []
    direct = {canonicalize_name(Requirement(r).name): Requirement(r) for r in requirements}
    for name, requirement in direct.items():
        pin = pins.get(name)
        if pin is None:
            problems.append(f"{requirement} is not in the lock")
        elif not requirement.specifier.contains(pin.version, prereleases=True):
            problems.append(f"{name}=={pin.version} does not satisfy {requirement}")
    # What the dependencies need: the direct ones, then whatever a needed pin is there for.
    needed: set[str] = set(direct)
    grew = True
    while grew:
        more = {n for n, pin in pins.items() if n not in needed and pin.via & needed}
        needed |= more
        grew = bool(more)
    problems += [f"{n}=={pins[n].version} is needed by no dependency" for n in pins.keys() - needed]
    problems += [f"{n}=={pin.version} has no hash" for n, pin in pins.items() if not pin.hashes]
    return sorted(problems)


def _pyproject() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def test_the_image_lock_matches_pyprojects_runtime_dependencies() -> None:
    pins = parse_lock(images.LOCK.read_text())
    assert drift(images.runtime_requirements(), pins) == [], FIX


def test_the_projects_own_distributions_are_built_here_and_their_needs_are_locked() -> None:
    """The worker library is a dependency of the product, built from ``worker/`` into the
    images: the lock pins what it needs, and not the distribution itself."""
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    own = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    assert set(images.LOCAL_DISTRIBUTIONS) <= own
    required = {canonicalize_name(Requirement(r).name) for r in images.runtime_requirements()}
    assert {"grpcio", "protobuf"} <= required
    assert not required & set(images.LOCAL_DISTRIBUTIONS)
    assert not parse_lock(images.LOCK.read_text()).keys() & set(images.LOCAL_DISTRIBUTIONS)


def test_the_build_lock_matches_pyprojects_build_backend() -> None:
    pins = parse_lock(images.BUILD_LOCK.read_text())
    assert drift(images.build_requirements(), pins) == [], FIX


def test_the_lock_says_how_it_was_made() -> None:
    for lock in (images.LOCK, images.BUILD_LOCK):
        assert images.LOCK_COMMAND in lock.read_text()


# The checker itself, on locks that drifted in each way a change to pyproject.toml makes them.
LOCK = """\
aiohttp==3.14.5 \\
    --hash=sha256:{h}
    # via shoal (pyproject.toml)
yarl==1.25.1 \\
    --hash=sha256:{h}
    # via aiohttp
idna==3.20 \\
    --hash=sha256:{h}
    # via
    #   requests
    #   yarl
""".replace("{h}", "0" * 64)


def test_a_lock_that_matches_passes() -> None:
    assert drift(["aiohttp>=3.10,<4"], parse_lock(LOCK)) == []


@pytest.mark.parametrize(
    ("requirements", "lock", "problem"),
    [
        (["aiohttp>=3.10", "structlog>=24.4"], LOCK, "structlog>=24.4 is not in the lock"),
        (["aiohttp>=4"], LOCK, "aiohttp==3.14.5 does not satisfy aiohttp>=4"),
        (["yarl"], LOCK, "aiohttp==3.14.5 is needed by no dependency"),
        (["aiohttp"], LOCK.replace("--hash=sha256:" + "0" * 64, ""), "yarl==1.25.1 has no hash"),
    ],
    ids=["added", "raised", "removed", "unhashed"],
)
def test_a_lock_that_drifted_fails_saying_how(
    requirements: list[str], lock: str, problem: str
) -> None:
    assert problem in drift(requirements, parse_lock(lock))
