"""Build the control-plane binaries once, into a cache keyed by the pinned versions.

A complete cache makes ``build`` a no-op (a few file checks). Otherwise each missing binary is
compiled with the machine's Go from the module proxy, written under a temporary name and renamed
into place, so an interrupted build never leaves a half-written binary that looks complete.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from devcluster.errors import BuildError
from devcluster.versions import GO_DIR, TARGETS, Target, Versions, bin_dir, pinned

MANIFEST = "manifest.json"
Say = Callable[[str], None]


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def missing(directory: Path) -> list[str]:
    """Names of the binaries not yet in the cache (all of them when the manifest is absent)."""
    if not (directory / MANIFEST).is_file():
        return [t.name for t in TARGETS]
    return [t.name for t in TARGETS if not os.access(directory / t.name, os.X_OK)]


def go_environment() -> dict[str, str]:
    """The environment for ``go``: the committed go.sum is the trust root.

    The checksum database is not reachable from every machine; go.sum lists every module the
    build needs, so it is switched off rather than left to fail. The build never downloads a
    different toolchain and links statically.
    """
    env = dict(os.environ)
    env["GOSUMDB"] = "off"
    env["GOFLAGS"] = "-mod=readonly -trimpath -buildvcs=false"
    env["GOTOOLCHAIN"] = "local"
    env["CGO_ENABLED"] = "0"
    return env


def check_go(required: str) -> str:
    """The Go version on PATH; raises BuildError when absent or older than ``required``."""
    go = shutil.which("go")
    if go is None:
        raise BuildError(
            f"Go {required} or newer is needed to build the local control plane, and `go` is not "
            "on PATH. Install Go (https://go.dev/dl) and run `python -m devcluster build` again."
        )
    out = subprocess.run([go, "version"], capture_output=True, text=True, check=False).stdout
    match = re.search(r"go(\d+)\.(\d+)(?:\.(\d+))?", out)
    if not match:
        raise BuildError(f"cannot read the Go version from {out!r}")
    have = tuple(int(x or 0) for x in match.groups())
    need = tuple(int(x) for x in ([*required.split("."), "0", "0"])[:3])
    if have < need:
        raise BuildError(f"Go {required} or newer is needed; found {match.group(0)} at {go}")
    return match.group(0)


def build(versions: Versions | None = None, *, say: Say = _say, force: bool = False) -> Path:
    """Make sure every binary is in the cache; returns the folder that holds them."""
    versions = versions or pinned()
    directory = bin_dir(versions)
    todo = [t for t in TARGETS if force or t.name in missing(directory)]
    if not todo:
        return directory
    go_version = check_go(versions.go)
    directory.mkdir(parents=True, exist_ok=True)
    say(
        f"devcluster: building {len(todo)} binaries (Kubernetes {versions.kubernetes}, "
        f"etcd {versions.etcd}, kwok {versions.kwok}) with {go_version} into {directory}"
    )
    say("devcluster: the first build downloads modules and compiles for several minutes")
    started = time.monotonic()
    for number, target in enumerate(todo, 1):
        _build_one(target, directory, say, f"[{number}/{len(todo)}]")
    manifest = {
        "kubernetes": versions.kubernetes,
        "etcd": versions.etcd,
        "kwok": versions.kwok,
        "go": go_version,
        "built_seconds": round(time.monotonic() - started, 1),
        "binaries": [t.name for t in TARGETS],
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    say(f"devcluster: built in {time.monotonic() - started:.0f} s")
    return directory


def _build_one(target: Target, out_dir: Path, say: Say, step: str) -> None:
    name, module_dir, package = target.name, GO_DIR / target.module, target.package
    partial = out_dir / f".{name}.partial"
    command = ["go", "build", "-ldflags=-s -w", "-o", str(partial), package]
    say(f"devcluster: {step} {name} ...")
    started = time.monotonic()
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(30):
            say(f"devcluster: {step} {name} still compiling ({time.monotonic() - started:.0f} s)")

    ticker = threading.Thread(target=heartbeat, daemon=True)
    ticker.start()
    try:
        result = subprocess.run(
            command,
            cwd=module_dir,
            env=go_environment(),
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        done.set()
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise BuildError(
            f"building {name} failed (exit {result.returncode}) in {module_dir}:\n"
            f"$ {' '.join(command)}\n{result.stderr[-4000:]}"
        )
    partial.replace(out_dir / name)
    say(f"devcluster: {step} {name} done in {time.monotonic() - started:.0f} s")
