"""Session-wide hooks: print and save the reliability figures the tests recorded."""

from __future__ import annotations

import pytest

from tests import figures


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    text = figures.lines()
    if not text:
        return
    terminalreporter.section("reliability figures")
    for line in text:
        terminalreporter.write_line(line)
    path = figures.save()
    terminalreporter.write_line(f"(saved to {path})")
