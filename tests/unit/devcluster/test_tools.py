"""Every third-party tool the tests run is pinned the way the control plane is: its go.mod
requires the module at one version, its committed go.sum holds that version's checksums, and
its tools.go imports the command that is built."""

from __future__ import annotations

import re

import pytest

from devcluster import tools


@pytest.mark.parametrize("name", sorted(tools.TOOLS))
def test_tool_is_pinned_by_its_committed_go_mod_and_go_sum(name: str) -> None:
    tool = tools.TOOLS[name]
    folder = tools.TOOLS_DIR / name
    version = tools.version(tool)
    assert re.fullmatch(r"v\d+\.\d+\.\d+", version)
    checksums = (folder / "go.sum").read_text().splitlines()
    assert any(line.startswith(f"{tool.module} {version} h1:") for line in checksums)
    assert any(line.startswith(f"{tool.module} {version}/go.mod h1:") for line in checksums)
    assert f'import _ "{tool.package}"' in (folder / "tools.go").read_text()
    assert tools.directory(tool).name.startswith(f"{name}-{version}-")


def test_training_operator_is_the_release_its_tests_are_written_for() -> None:
    assert tools.version(tools.TOOLS["training-operator"]) == "v1.8.1"


def test_kueue_is_the_release_its_tests_are_written_for() -> None:
    assert tools.version(tools.TOOLS["kueue"]) == "v0.17.0"
