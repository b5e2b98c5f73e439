"""The build is a no-op on a complete cache, and refuses clearly without a usable Go."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from devcluster import build, versions
from devcluster.errors import BuildError


def _complete_cache(root: Path) -> Path:
    directory = root / versions.pinned().key / "bin"
    directory.mkdir(parents=True)
    for target in versions.TARGETS:
        path = directory / target.name
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    (directory / build.MANIFEST).write_text("{}")
    return directory


def test_pinned_versions_come_from_the_committed_go_mod_files() -> None:
    pinned = versions.pinned()
    assert pinned.kubernetes.startswith("v1.")
    assert pinned.etcd.startswith("v3.")
    assert pinned.kwok.startswith("v0.")
    assert pinned.kubernetes in pinned.key


def test_complete_cache_is_a_fast_no_op(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = _complete_cache(tmp_path)
    monkeypatch.setenv(versions.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("PATH", "")  # no Go at all: a cached build must not need it
    said: list[str] = []
    started = time.monotonic()
    assert build.build(say=said.append) == expected
    assert time.monotonic() - started < 2
    assert said == []


def test_missing_binary_is_detected(tmp_path: Path) -> None:
    directory = _complete_cache(tmp_path)
    os.unlink(directory / "kwok")
    assert build.missing(directory) == ["kwok"]
    os.unlink(directory / build.MANIFEST)
    assert len(build.missing(directory)) == len(versions.TARGETS)


def test_without_go_the_error_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(versions.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("PATH", "")
    with pytest.raises(BuildError, match=r"Go 1\.[\d.]+ or newer is needed"):
        build.build(say=lambda _m: None)


def test_go_environment_trusts_the_committed_go_sum() -> None:
    env = build.go_environment()
    assert env["GOSUMDB"] == "off"
    assert "-mod=readonly" in env["GOFLAGS"]
    assert env["GOTOOLCHAIN"] == "local"
