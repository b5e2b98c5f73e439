"""What ships is the product: the wheel and the images hold the two programs, the kubectl
plugin and what they share, never the fakes, the devcluster, the demo or the benchmarks."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = {"contracts", "common", "scheduler", "nodeagent", "shoalctl"}
TOOLING = ("fakes/", "devcluster/", "demo/", "bench/", "tests/")


def test_the_wheel_holds_the_product_and_no_tooling(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    [wheel] = tmp_path.glob("shoal-*.whl")
    files = zipfile.ZipFile(wheel).namelist()
    tops = {f.split("/", 1)[0] for f in files if not f.startswith("shoal-")}
    assert tops == PRODUCT
    assert [f for f in files if f.startswith(TOOLING)] == []
    assert "nodeagent/notify/notices_pb2.py" in files  # generated code the agent needs
    # The web view's page is package data, served by the scheduler itself.
    for name in ("index.html", "app.js", "app.css"):
        assert f"scheduler/web/static/{name}" in files

    # kubectl finds the plugin as `kubectl-shoal` on PATH, its completion as
    # `kubectl_complete-shoal`: both are installed with the package and run.
    target = tmp_path / "installed"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    env = {"PYTHONPATH": f"{target}:{':'.join(sys.path[1:])}", "PATH": "/usr/bin:/bin"}
    helped = subprocess.run(
        [str(target / "bin" / "kubectl-shoal"), "--help"],
        check=False,
        env=env,
        capture_output=True,
        text=True,
    )
    assert helped.returncode == 0, helped.stderr
    assert "{gangs,why,nodes,completion}" in helped.stdout
    completed = subprocess.run(
        [str(target / "bin" / "kubectl_complete-shoal"), "g"],
        check=False,
        env=env,
        capture_output=True,
        text=True,
    )
    assert completed.stdout == "gangs\n:4\n"


def test_the_images_copy_only_the_product() -> None:
    for dockerfile in ROOT.glob("Dockerfile.*"):
        copied = re.findall(r"(?m)^COPY (?!--from)(.+) \S+$", dockerfile.read_text())
        sources = {s.rstrip("/") for line in copied for s in line.split()}
        assert sources <= PRODUCT | {"pyproject.toml", "README.md"}, (dockerfile.name, sources)


def test_torch_is_only_an_extra_and_no_image_installs_it(tmp_path: Path) -> None:
    """The worker library for torch.distributed ships in the wheel, but torch (gigabytes) comes
    only with ``shoal[torch]``: the agent and scheduler images install the bare product."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    [wheel] = tmp_path.glob("shoal-*.whl")
    archive = zipfile.ZipFile(wheel)
    assert "nodeagent/client/distributed.py" in archive.namelist()
    [metadata] = [f for f in archive.namelist() if f.endswith(".dist-info/METADATA")]
    requires = re.findall(r"(?m)^Requires-Dist: (.+)$", archive.read(metadata).decode())
    torch = [r for r in requires if r.startswith("torch")]
    assert torch
    assert all("extra ==" in r for r in torch), torch
    assert any("extra == 'torch'" in r or 'extra == "torch"' in r for r in torch), torch
    for dockerfile in ROOT.glob("Dockerfile.*"):
        installs = re.findall(r"pip install[^\n]*", dockerfile.read_text())
        assert installs, dockerfile.name
        assert not [i for i in installs if "[" in i or "torch" in i], (dockerfile.name, installs)
