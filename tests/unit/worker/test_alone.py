"""``pip install shoal-worker`` alone is enough for a worker: in a fresh virtualenv that holds the
worker distribution and nothing of the agent or the scheduler, ``python -m shoal_worker wait``
hears a real agent's notice and ``ack`` is accepted (the agent records the step).

The distribution is built from ``worker/`` as a wheel and installed with ``--no-deps``; the
dependencies its wheel declares (grpcio and protobuf, and what they need) come from this test
run's environment through a ``.pth`` file naming a folder that holds only those distributions
(symlinks to their files), so the test needs no package index for them."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Iterator
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.unit.nodeagent.notice_socket import PODS, SocketAgent, notice

ROOT = Path(__file__).resolve().parents[3]
#: What a worker must not need, and must not find installed beside it.
NOT_WORKERS = (
    "nodeagent",
    "scheduler",
    "contracts",
    "common",
    "kubernetes",
    "aiohttp",
    "structlog",
)


def declared(requirements: Iterable[str]) -> list[str]:
    """The names of the requirements that hold without extras, on this interpreter."""
    names = []
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            names.append(requirement.name)
    return names


def link_distributions(names: list[str], into: Path) -> list[str]:
    """Symlink into ``into`` the files of the named installed distributions and of everything
    they need; returns the distributions' names."""
    seen: list[str] = []
    while names:
        dist = metadata.distribution(names.pop())
        if dist.name in seen:
            continue
        seen.append(dist.name)
        names += declared(dist.requires or [])
        for file in dist.files or []:
            parts = Path(file).parts
            if parts[0] in ("..", "__pycache__"):
                continue
            # A namespace package (google/) is a folder of its own; its parts are linked.
            namespace = not Path(str(dist.locate_file(Path(parts[0], "__init__.py")))).exists()
            top = Path(*parts[: 2 if namespace and len(parts) > 2 else 1])
            if not (into / top).exists():
                (into / top).parent.mkdir(parents=True, exist_ok=True)
                (into / top).symlink_to(Path(str(dist.locate_file(top))))
    return seen


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the worker wheel installed and what its wheel declares."""
    base = tmp_path_factory.mktemp("alone")
    dist = base / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), "."],
        cwd=ROOT / "worker",
        check=True,
        capture_output=True,
    )
    [wheel] = dist.glob("shoal_worker-*.whl")
    archive = zipfile.ZipFile(wheel)
    [meta] = [f for f in archive.namelist() if f.endswith(".dist-info/METADATA")]
    lines = archive.read(meta).decode().splitlines()
    needs = declared(x.split(": ", 1)[1] for x in lines if x.startswith("Requires-Dist: "))
    assert sorted(needs) == ["grpcio", "protobuf"]

    env = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    subprocess.run(
        [*pip, "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
    )
    deps = base / "deps"
    deps.mkdir()
    linked = link_distributions(needs, deps)
    assert not {"shoal", "shoal-worker", "kubernetes"} & set(linked), linked
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(purelib) / "worker_dependencies.pth").write_text(f"{deps}\n")
    return python


def run(
    python: Path, *args: str, env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    command = [str(python), *args]
    return subprocess.run(command, check=False, env=env, cwd=cwd, capture_output=True, text=True)


def pod_env(index: int, agent: SocketAgent) -> dict[str, str]:
    namespace, name, uid = PODS[index]
    return {
        "PATH": "/usr/bin:/bin",
        "POD_NAMESPACE": namespace,
        "POD_NAME": name,
        "POD_UID": uid,
        "SHOAL_SOCKET": agent.socket_path,
    }


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[SocketAgent]:
    node = SocketAgent(tmp_path / "agent.sock")
    node.start()
    yield node
    node.stop()


@pytest.fixture
def away(tmp_path: Path) -> Path:
    """A folder outside the checkout to run from, so that nothing of it is on sys.path."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    return folder


def test_the_worker_installed_alone_hears_a_real_agent_and_acknowledges(
    venv: Path, agent: SocketAgent, away: Path
) -> None:
    env = pod_env(0, agent)
    found = run(
        venv,
        "-c",
        "import importlib.util as u, shoal_worker, shoal_worker.cli; "
        f"print([m for m in {NOT_WORKERS!r} if u.find_spec(m)])",
        env=env,
        cwd=away,
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "[]"

    agent.observe([notice("spot-alone")])
    heard = run(venv, "-m", "shoal_worker", "wait", env=env, cwd=away)
    assert heard.returncode == 0, heard.stderr
    told = json.loads(heard.stdout)
    assert (told["event_id"], told["source"]) == ("spot-alone", "aws")

    acked = run(venv, "-m", "shoal_worker", "ack", "41", env=env, cwd=away)
    assert acked.returncode == 0, acked.stderr
    pod = f"{env['POD_NAMESPACE']}/{env['POD_NAME']}"
    assert agent.until(lambda: agent.acked().get(pod) == 41, "the agent recorded the ack")


def test_the_worker_installed_alone_is_refused_for_a_pod_not_under_notice(
    venv: Path, agent: SocketAgent, away: Path
) -> None:
    env = pod_env(1, agent)
    refused = run(venv, "-m", "shoal_worker", "ack", "3", env=env, cwd=away)
    assert refused.returncode == 3, (refused.stdout, refused.stderr)
    assert "refused" in refused.stderr
    assert agent.acked().get(f"{env['POD_NAMESPACE']}/{env['POD_NAME']}") is None
