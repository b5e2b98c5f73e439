"""What ships is the product: the wheel and the images hold the two programs, the kubectl
plugin and what they share, never the fakes, the devcluster, the demo or the benchmarks. The
worker library is a distribution of its own (``worker/``, ``shoal-worker``): the socket protocol
and the client, which the agent depends on and training images install alone."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = {"contracts", "common", "scheduler", "nodeagent", "shoalctl"}
TOOLING = ("fakes/", "devcluster/", "demo/", "bench/", "tests/")
WORKER = ROOT / "worker"


def build_wheel(source: Path, into: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(into), str(source)],
        check=True,
        capture_output=True,
    )
    [wheel] = into.glob("*.whl")
    return wheel


def requires(wheel: Path) -> list[str]:
    archive = zipfile.ZipFile(wheel)
    [metadata] = [f for f in archive.namelist() if f.endswith(".dist-info/METADATA")]
    return re.findall(r"(?m)^Requires-Dist: (.+)$", archive.read(metadata).decode())


def test_the_wheel_holds_the_product_and_no_tooling(tmp_path: Path) -> None:
    wheel = build_wheel(ROOT, tmp_path)
    files = zipfile.ZipFile(wheel).namelist()
    tops = {f.split("/", 1)[0] for f in files if not f.startswith("shoal-")}
    assert tops == PRODUCT
    assert [f for f in files if f.startswith(TOOLING)] == []
    # The protocol's generated code has one home, the worker distribution, at its version.
    assert [f for f in files if "_pb2" in f and "notices" in f] == []
    assert "shoal-worker==0.3.0" in requires(wheel)
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
        # requirements/: the locks the dependencies are installed from.
        allowed = PRODUCT | {"pyproject.toml", "README.md", "requirements", "worker"}
        assert sources <= allowed, (dockerfile.name, sources)


def test_the_worker_wheel_holds_the_worker_library_and_the_protocol_only(tmp_path: Path) -> None:
    wheel = build_wheel(WORKER, tmp_path)
    files = zipfile.ZipFile(wheel).namelist()
    assert {f.split("/", 1)[0] for f in files if ".dist-info/" not in f} == {"shoal_worker"}
    for name in ("notices.proto", "notices_pb2.py", "notices_pb2_grpc.py", "rpc.py"):
        assert f"shoal_worker/protocol/{name}" in files
    assert "shoal_worker/py.typed" in files
    needs = {re.split(r"[<>=;\s\[]", r, maxsplit=1)[0] for r in requires(wheel) if "extra" not in r}
    assert needs == {"grpcio", "protobuf"}


def test_torch_is_only_an_extra_and_no_image_installs_it(tmp_path: Path) -> None:
    """The worker library for torch.distributed ships in the worker wheel, but torch (gigabytes)
    comes only with ``shoal-worker[torch]`` (or ``shoal[torch]``, its former name): the agent
    and scheduler images install the bare product."""
    worker = build_wheel(WORKER, tmp_path / "worker")
    assert "shoal_worker/distributed.py" in zipfile.ZipFile(worker).namelist()
    product = build_wheel(ROOT, tmp_path / "product")
    for wheel, extra in ((worker, "torch"), (product, "shoal-worker[torch]")):
        torch = [r for r in requires(wheel) if r.startswith(extra)]
        assert torch, wheel.name
        assert all("extra == 'torch'" in r or 'extra == "torch"' in r for r in torch), torch
    bare = [r for r in requires(product) if r.startswith("torch") and "extra ==" not in r]
    assert bare == []
    for dockerfile in ROOT.glob("Dockerfile.*"):
        installs = re.findall(r"pip install[^\n]*", dockerfile.read_text())
        assert installs, dockerfile.name
        assert not [i for i in installs if "[" in i or "torch" in i], (dockerfile.name, installs)
