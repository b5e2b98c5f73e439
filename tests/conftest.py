"""Session-wide hooks: print and save the reliability figures the tests recorded.

Under pytest-xdist the tests run in worker processes: each worker hands its figures back to the
controller when it finishes (``workeroutput``), and the controller prints and saves them all.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests import figures

FIGURES_KEY = "shoal_reliability_figures"


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down
def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput: dict[str, Any] | None = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller reports
        workeroutput[FIGURES_KEY] = figures.dumped()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """xdist's controller, as each worker finishes: take its figures in."""
    text = getattr(node, "workeroutput", {}).get(FIGURES_KEY)
    if text:
        figures.merge(text)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if hasattr(terminalreporter.config, "workeroutput"):
        return  # a worker: its figures go to the controller
    text = figures.lines()
    if not text:
        return
    terminalreporter.section("reliability figures")
    for line in text:
        terminalreporter.write_line(line)
    path = figures.save()
    terminalreporter.write_line(f"(saved to {path})")
