"""What gets built: the pinned releases, read from the committed go.mod files, and the cache key."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

GO_DIR: Final = Path(__file__).resolve().parent / "go"
CACHE_ENV: Final = "SHOAL_DEVCLUSTER_CACHE"


@dataclass(frozen=True, slots=True)
class Target:
    """One binary: the Go module folder it is built in and the package path it builds."""

    name: str
    module: str
    package: str


TARGETS: Final = (
    Target("etcd", "etcd", "."),
    Target("kwok", "kwok", "sigs.k8s.io/kwok/cmd/kwok"),
    Target("kwok-stages", "kwok", "./stages"),
    Target("kube-apiserver", "kubernetes", "k8s.io/kubernetes/cmd/kube-apiserver"),
    Target(
        "kube-controller-manager", "kubernetes", "k8s.io/kubernetes/cmd/kube-controller-manager"
    ),
    Target("kube-scheduler", "kubernetes", "k8s.io/kubernetes/cmd/kube-scheduler"),
    Target("kubectl", "kubernetes", "k8s.io/kubernetes/cmd/kubectl"),
    # The ceiling in bench/compare.py: round-robin bindings, no decisions.
    Target("bench-binder", "kubernetes", "./binder"),
)


@dataclass(frozen=True, slots=True)
class Versions:
    kubernetes: str
    etcd: str
    kwok: str
    go: str  # the minimum Go the modules declare

    @property
    def key(self) -> str:
        """Cache folder name: the releases plus a digest of the committed go.mod/go.sum files."""
        digest = hashlib.sha256()
        for path in sorted(GO_DIR.glob("*/go.*")) + sorted(GO_DIR.glob("*/**/*.go")):
            digest.update(path.relative_to(GO_DIR).as_posix().encode())
            digest.update(path.read_bytes())
        return f"k8s-{self.kubernetes}-etcd-{self.etcd}-kwok-{self.kwok}-{digest.hexdigest()[:10]}"


def _required(module_dir: str, module: str) -> str:
    text = (GO_DIR / module_dir / "go.mod").read_text()
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", text, re.MULTILINE)
    if not match:
        raise RuntimeError(f"{module} is not required in devcluster/go/{module_dir}/go.mod")
    return match.group(1)


def _go_directive() -> str:
    text = (GO_DIR / "kubernetes" / "go.mod").read_text()
    match = re.search(r"^go\s+(\S+)", text, re.MULTILINE)
    return match.group(1) if match else "1.26"


def pinned() -> Versions:
    return Versions(
        kubernetes=_required("kubernetes", "k8s.io/kubernetes"),
        etcd=_required("etcd", "go.etcd.io/etcd/server/v3"),
        kwok=_required("kwok", "sigs.k8s.io/kwok"),
        go=_go_directive(),
    )


def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "shoal" / "devcluster"


def bin_dir(versions: Versions | None = None) -> Path:
    return cache_root() / (versions or pinned()).key / "bin"
