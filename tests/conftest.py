"""Session-wide hooks: print and save the reliability figures the tests recorded.

Under pytest-xdist the tests run in worker processes: each worker hands its figures back to the
controller when it finishes (``workeroutput``), and the controller prints and saves them all.
"""

from __future__ import annotations

import atexit
import math
import os
import re
import shutil
import tempfile
from typing import Any

import pytest

from tests import figures

FIGURES_KEY = "shoal_reliability_figures"

# Node agents that tests run as host processes keep their pod file in a folder of this test
# process, never in the default /var/lib/shoal-agent: that is the real node's hostPath, and an
# agent run as root there leaves a file the real node's agent (uid 65532) cannot read. The folder
# goes when this process ends (once, every pytest process of every run left one in /tmp).
if "SHOAL_STATE_DIR" not in os.environ:
    os.environ["SHOAL_STATE_DIR"] = tempfile.mkdtemp(prefix=f"shoal-agent-state-{os.getpid()}-")
    atexit.register(shutil.rmtree, os.environ["SHOAL_STATE_DIR"], ignore_errors=True)
#: Folders whose tests share one costly session fixture (set up again by every worker that
#: draws one of them): each runs on one worker. The real node: a kubelet, containerd and the
#: images, which the machine holds once; the Slurm cluster, started once for its folder.
ONE_WORKER_FOLDERS = ("tests/integration/realnode/", "tests/integration/slurm/")
#: Under xdist, tests start longest first, so that no worker is left with a long test at the end
#: while the others stand idle: by the seconds each took when it last ran (setup, call and
#: teardown, kept in pytest's cache under ``DURATIONS``), and a test never timed by the first of
#: these prefixes it starts with (the longer kinds first).
FIRST = ("tests/integration/reliability/", "tests/integration/test_demo.py", "tests/integration/")
DURATIONS = "shoal/durations"
#: What xdist's group suffix looks like at the end of a test id (see below).
_GROUP_SUFFIX = re.compile(r"@[^@\]]*$")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker (a run without xdist is left as collected): a module whose tests share
    a fixture wider than one test (a control plane of the module's own, manifests installed
    once) runs on one worker, in order, under ``--dist loadgroup``; otherwise each worker that
    drew one of its tests would set that fixture up again. Groups stay together and in order;
    the longest start first (:func:`longest_first`)."""
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
    items[:] = longest_first(config, items)
    if config.getoption("loadgroup", False):
        # xdist 3.8 marks a group by appending "@<group>" to ``item._nodeid``, which pytest 9.2
        # no longer reads (the id is ``item._id``): it is appended here instead.
        for item in items:
            if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid:
                item._id = f"{item.nodeid}@{group_of(item)}"  # type: ignore[assignment]


def longest_first(config: pytest.Config, items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` with each group together and in order, the groups that took longest first
    (but for the few that each worker is handed behind its first)."""
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        groups.setdefault(group_of(item), []).append(item)
    took = last_durations(config)
    # A test never timed counts as the mean of the timed ones of its kind; with none timed, as
    # longer than any (so an empty cache gives the order of ``FIRST``).
    kinds: dict[int, list[float]] = {}
    for item in items:
        if item.nodeid in took:
            kinds.setdefault(rank(item), []).append(took[item.nodeid])
    guess = {kind: sum(seconds) / len(seconds) for kind, seconds in kinds.items()}

    def seconds(members: list[pytest.Item]) -> float:
        return sum(took.get(item.nodeid, guess.get(rank(item), math.inf)) for item in members)

    ordered = sorted(groups.values(), key=lambda members: (-seconds(members), rank(members[0])))
    # xdist hands each worker its first group and, before any runs, two more tests: let those be
    # the shortest, so that no worker holds two long ones while another has nothing to do.
    workers = int(getattr(config, "workerinput", {}).get("workercount", 0))
    if workers and len(ordered) > 3 * workers:
        head = ordered[:workers]
        rest = ordered[workers:]
        short = sorted((g for g in rest if seconds(g) < math.inf), key=seconds)[: 2 * workers]
        ordered = head + short + [g for g in rest if not any(g is s for s in short)]
    return [item for members in ordered for item in members]


def last_durations(config: pytest.Config) -> dict[str, float]:
    """Seconds per test id from the runs before (empty without pytest's cache). An xdist worker
    has them from the controller, which read them once for all: every worker orders the tests
    the same way (or xdist stops), even if another run writes the cache meanwhile."""
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if workerinput is not None:
        sent = workerinput.get(DURATIONS, {})
        return sent if isinstance(sent, dict) else {}
    if config not in _read:
        cache = getattr(config, "cache", None)
        found = cache.get(DURATIONS, {}) if cache is not None else {}
        _read[config] = found if isinstance(found, dict) else {}
    return _read[config]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist's controller, as it starts each worker: hand it the last run's durations."""
    node.workerinput[DURATIONS] = last_durations(node.config)


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


_took: dict[str, float] = {}
#: The durations read from the cache, by session (read once).
_read: dict[pytest.Config, dict[str, float]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each test's seconds, setup to teardown; xdist's controller hears every worker's."""
    test = _GROUP_SUFFIX.sub("", report.nodeid)
    _took[test] = _took.get(test, 0.0) + report.duration


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down
def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput: dict[str, Any] | None = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller reports
        workeroutput[FIGURES_KEY] = figures.dumped()
        return
    cache = getattr(session.config, "cache", None)
    if cache is not None and _took:  # for the next run's order; tests not run keep theirs
        cache.set(DURATIONS, {**last_durations(session.config), **_took})


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
