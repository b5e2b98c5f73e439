"""Session-wide hooks: print and save the reliability figures the tests recorded.

Under pytest-xdist the tests run in worker processes: each worker hands its figures back to the
controller when it finishes (``workeroutput``), and the controller prints and saves them all.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest

from tests import figures

FIGURES_KEY = "shoal_reliability_figures"

# Node agents that tests run as host processes keep their pod file in a folder of this test
# process, never in the default /var/lib/shoal-agent: that is the real node's hostPath, and an
# agent run as root there leaves a file the real node's agent (uid 65532) cannot read.
os.environ.setdefault(
    "SHOAL_STATE_DIR", tempfile.mkdtemp(prefix=f"shoal-agent-state-{os.getpid()}-")
)
#: Folders whose tests share one costly session fixture (set up again by every worker that
#: draws one of them): each runs on one worker. The real node: a kubelet, containerd and the
#: images, which the machine holds once.
ONE_WORKER_FOLDERS = ("tests/integration/realnode/",)
#: Under xdist, tests start in this order (first match), the longest kinds first, so that no
#: worker is left with a long test at the end while the others stand idle.
FIRST = ("tests/integration/reliability/", "tests/integration/test_demo.py", "tests/integration/")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker (a run without xdist is left as collected): a module whose tests share
    a fixture wider than one test (a control plane of the module's own, manifests installed
    once) runs on one worker, in order, under ``--dist loadgroup``; otherwise each worker that
    drew one of its tests would set that fixture up again. Groups stay together and in order;
    the longer kinds of test are started first."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        folder = next((f for f in ONE_WORKER_FOLDERS if item.nodeid.startswith(f)), None)
        if folder is not None:
            item.add_marker(pytest.mark.xdist_group(folder))
        elif shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        groups.setdefault(group_of(item), []).append(item)
    ordered = sorted(groups.values(), key=lambda members: rank(members[0]))  # stable
    items[:] = [item for members in ordered for item in members]
    if config.getoption("loadgroup", False):
        # xdist 3.8 marks a group by appending "@<group>" to ``item._nodeid``, which pytest 9.2
        # no longer reads (the id is ``item._id``): it is appended here instead.
        for item in items:
            if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid:
                item._id = f"{item.nodeid}@{group_of(item)}"  # type: ignore[assignment]


def group_of(item: pytest.Item) -> str:
    marker = item.get_closest_marker("xdist_group")
    if marker is None:
        return item.nodeid
    return str(marker.args[0] if marker.args else marker.kwargs.get("name", "default"))


def rank(item: pytest.Item) -> int:
    return next((i for i, prefix in enumerate(FIRST) if item.nodeid.startswith(prefix)), len(FIRST))


def shares_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        definition.scope in ("module", "package", "class")
        for definitions in info.name2fixturedefs.values()
        for definition in definitions
    )


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
