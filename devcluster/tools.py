"""Third-party tools the tests run beside the control plane (helm, the Kubeflow
training-operator, Kueue), built the way the control plane is: from the Go module pinned by the
committed ``go.mod`` and ``go.sum`` under ``devcluster/tools/<name>/``, once, into a cache outside
the repository keyed by the version and a digest of those files. A complete cache makes
:func:`ensure` a file check."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from devcluster import build
from devcluster.errors import BuildError
from devcluster.versions import Target, cache_root

TOOLS_DIR: Final = Path(__file__).resolve().parent / "tools"


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    #: The module whose version names the cache folder.
    module: str
    package: str


TOOLS: Final = {
    "helm": Tool("helm", "helm.sh/helm/v4", "helm.sh/helm/v4/cmd/helm"),
    "training-operator": Tool(
        "training-operator",
        "github.com/kubeflow/training-operator",
        "github.com/kubeflow/training-operator/cmd/training-operator.v1",
    ),
    "kueue": Tool("kueue", "sigs.k8s.io/kueue", "sigs.k8s.io/kueue/cmd/kueue"),
}


def version(tool: Tool) -> str:
    text = (TOOLS_DIR / tool.name / "go.mod").read_text()
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(tool.module)}\s+(v\S+)", text, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"{tool.module} is not required in devcluster/tools/{tool.name}/go.mod")
    return match.group(1)


def directory(tool: Tool) -> Path:
    """The cache folder of ``tool``'s pinned build."""
    digest = hashlib.sha256()
    for path in sorted((TOOLS_DIR / tool.name).glob("go.*")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return cache_root() / "tools" / f"{tool.name}-{version(tool)}-{digest.hexdigest()[:10]}"


def ensure(name: str, *, say: build.Say = build._say) -> Path:
    """The path of the tool's binary, built first when the cache lacks it."""
    tool = TOOLS[name]
    folder = directory(tool)
    binary = folder / tool.name
    if os.access(binary, os.X_OK):
        return binary
    build.check_go(pinned_go(tool))
    folder.mkdir(parents=True, exist_ok=True)
    say(f"devcluster: building {tool.name} {version(tool)} into {folder} (once)")
    # An absolute module folder: the build joins it to devcluster/go/, which leaves it as it is.
    target = Target(tool.name, str(TOOLS_DIR / tool.name), tool.package)
    build._build_one(target, folder, say, "[tool]")
    return binary


def pinned_go(tool: Tool) -> str:
    text = (TOOLS_DIR / tool.name / "go.mod").read_text()
    match = re.search(r"^go\s+(\S+)", text, re.MULTILINE)
    return match.group(1) if match else "1.26"


def module_dir(name: str) -> Path:
    """The tool's module as published, in Go's module cache (downloaded first when absent and
    checked against the committed go.sum): where its own manifests, such as CRDs, are read
    from as they are."""
    tool = TOOLS[name]
    build.check_go(pinned_go(tool))
    result = subprocess.run(
        ["go", "mod", "download", "-json", tool.module],
        cwd=TOOLS_DIR / tool.name,
        env=build.go_environment(),
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise BuildError(
            f"cannot download {tool.module} {version(tool)} (exit {result.returncode}):\n"
            f"{result.stdout[-2000:]}{result.stderr[-2000:]}"
        )
    return Path(json.loads(result.stdout)["Dir"])
