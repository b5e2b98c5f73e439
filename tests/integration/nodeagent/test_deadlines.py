"""Deadlines against the devcluster, by the API server's clock: a notice already past its
deadline evicts at once through the Eviction API and says so on the pod; an agent whose clock is
90 s fast says so on its node and still evicts no earlier than the deadline minus the margin."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import UTC, timedelta
from pathlib import Path

import pytest

from fakes import metadata
from nodeagent.core.events import parse_rfc3339
from nodeagent.wiring.clock import TEST_OFFSET_ENV
from tests import figures
from tests.integration.conftest import Devcluster
from tests.integration.nodeagent.harness import disruption_target, events, eventually
from tests.integration.nodeagent.test_agent import Scene, make_scene

pytestmark = pytest.mark.reliability

SECTION = "agent deadlines"
MARGIN = 15
#: The injected error of the agent's clock (the test hook, see nodeagent/wiring/clock.py).
SKEW = 90.0


@pytest.fixture
def servers() -> Iterator[metadata.Threaded]:
    threaded = metadata.Threaded()
    yield threaded
    threaded.close()


@pytest.fixture
def late_scene(
    devcluster: Devcluster, namespace: str, servers: metadata.Threaded, tmp_path: Path
) -> Iterator[Scene]:
    margins = ["--evict-margin", str(MARGIN), "--gpu", "off"]
    yield from make_scene(devcluster, namespace, servers, tmp_path, "aws", extra=margins)


#: libfaketime (Debian's ``faketime`` package), when installed: the whole process's clock moved.
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


@pytest.fixture(params=["hook", "faketime"])
def fast_scene(
    request: pytest.FixtureRequest,
    devcluster: Devcluster,
    namespace: str,
    servers: metadata.Threaded,
    tmp_path: Path,
) -> Iterator[Scene]:
    """An agent whose clock is :data:`SKEW` seconds fast: through the agent's test hook (always),
    and through libfaketime as ``faketime -f +90s`` would (where it is installed)."""
    margins = ["--evict-margin", str(MARGIN), "--gpu", "off"]
    if request.param == "hook":
        env = {TEST_OFFSET_ENV: str(SKEW)}
    elif LIBFAKETIME.exists():
        env = {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": f"+{SKEW:g}s"}
    else:
        pytest.skip(f"no libfaketime at {LIBFAKETIME} (`make faketime` as root installs it)")
    yield from make_scene(devcluster, namespace, servers, tmp_path, "aws", extra=margins, env=env)


def test_a_notice_past_its_deadline_evicts_at_once_and_says_so(late_scene: Scene) -> None:
    scene = late_scene
    scene.cloud.renew(timedelta(seconds=-30))
    posted = time.monotonic()
    scene.cloud.post()

    evicted = eventually(
        lambda: disruption_target(scene.pod("trainer-0")) and scene.pod("trainer-0"),
        what="the eviction under the overdue notice",
    )
    latency = time.monotonic() - posted
    # The Eviction API, not a delete: its condition is what a Job's podFailurePolicy reads.
    assert disruption_target(evicted).reason == "EvictionByEvictionAPI"
    (said,) = eventually(
        lambda: events(scene.core, scene.namespace, "trainer-0", "LateNotice"),
        what="the LateNotice Event",
    )
    passed = r"The deadline \S+ had passed when the agent saw it \(\S+\): aws terminate"
    assert re.match(passed, said.message), said.message
    (told,) = events(scene.core, scene.namespace, "trainer-0", "LeaveBy")
    assert told.message.startswith("Leave now: the deadline "), told.message
    # The rest of the node goes the same way.
    sidecar = eventually(
        lambda: disruption_target(scene.pod("metrics-sidecar")), what="the sidecar's eviction"
    )
    assert sidecar.reason == "EvictionByEvictionAPI"
    assert not [line for line in scene.agent.log_lines() if line["event"] == "pod_deleted"]
    figures.record(
        SECTION, "overdue notice: seconds from posting to the eviction", round(latency, 2)
    )


def _metric(text: str, name: str, reference: str) -> float | None:
    pattern = rf'^{name}\{{reference="{reference}"\}} (\S+)$'
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else None


def test_a_fast_clock_is_reported_and_evicts_no_earlier_than_the_margin(
    fast_scene: Scene,
) -> None:
    scene = fast_scene

    def warned() -> list[str]:
        found = events(scene.core, "default", scene.node, "ClockSkew")
        return [e.message for e in found if "ahead of the API server's" in e.message]

    (message,) = eventually(warned, what="the ClockSkew Event on the node")
    said = re.match(r"This node's clock is (\d+\.\d) s \(± \d+\.\d s\) ahead of", message)
    assert said is not None, message
    assert abs(float(said.group(1)) - SKEW) < 2, message
    offsets = scene.agent.metrics()
    measured = _metric(offsets, "shoal_agent_clock_offset_seconds", "apiserver")
    metadata_offset = _metric(offsets, "shoal_agent_clock_offset_seconds", "metadata")
    assert measured is not None
    assert abs(measured + SKEW) < 2, measured

    scene.cloud.renew(timedelta(seconds=30))
    deadline = parse_rfc3339(scene.cloud.time)
    scene.cloud.post()
    condition = eventually(
        lambda: disruption_target(scene.pod("trainer-0")),
        timeout=60,
        what="the worker's eviction at the margin",
    )
    # By the API server's clock (the condition's time, whole seconds, rounded down): no
    # earlier than the deadline minus the margin, and before the deadline.
    at = condition.last_transition_time.astimezone(UTC)
    earliest = deadline - timedelta(seconds=MARGIN)
    assert earliest - timedelta(seconds=1) <= at < deadline, (at, deadline)
    assert not events(scene.core, scene.namespace, "trainer-0", "LateNotice")
    how = "faketime" if "FAKETIME" in scene.agent.env else "hook"
    figures.record(SECTION, f"{how}: injected clock offset (s)", -SKEW)
    figures.record(SECTION, f"{how}: measured offset, API server (s)", round(measured, 3))
    if metadata_offset is not None:
        figures.record(
            SECTION, f"{how}: measured offset, metadata server (s)", round(metadata_offset, 3)
        )
    figures.record(
        SECTION,
        f"{how}: eviction minus (deadline - margin), API server's clock (s)",
        (at - earliest).total_seconds(),
    )
