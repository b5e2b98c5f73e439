"""Where the web view's browser test finds Chromium, and what it says when there is none."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from devcluster import browser


def test_a_named_binary_then_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(browser.ENV, raising=False)
    assert browser.find() == fake
    monkeypatch.setenv(browser.ENV, str(tmp_path / "missing"))
    with pytest.raises(browser.BrowserUnavailable, match="is not an executable file"):
        browser.find()


def test_none_says_how_to_get_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(browser.ENV, raising=False)
    with pytest.raises(browser.BrowserUnavailable, match="make browser"):
        browser.find()
    # Nothing to install with: the reason names what is missing, and nothing is run.
    with pytest.raises(browser.BrowserUnavailable, match="apt-get is not available"):
        browser.ensure(say=lambda _: None)
    if os.geteuid() != 0:
        return
    (tmp_path / "apt-get").write_text("#!/bin/sh\nexit 100\n")
    (tmp_path / "apt-get").chmod(0o755)
    monkeypatch.setenv("SHOAL_DEVCLUSTER_CACHE", str(tmp_path / "cache"))
    with pytest.raises(browser.BrowserUnavailable, match="`apt-get install chromium` failed"):
        browser.ensure(say=lambda _: None)
