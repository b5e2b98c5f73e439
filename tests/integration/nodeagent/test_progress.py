"""Progress reports through a real agent to the pod (protocol 0.2.0): a worker using the
library reports, the agent writes the pod's ``shoal.dev/progress`` at once, a burst of reports
within the minute costs one more write only, a minute after the first, with the newest values;
a worker that never reports still hears its notice."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from shoal_worker import NoticeClient, ProgressReporter

from contracts import names
from contracts.progress import MIN_WRITE_INTERVAL_S, Progress, decode
from fakes import metadata
from tests import figures
from tests.integration.conftest import Devcluster
from tests.integration.nodeagent.harness import eventually
from tests.integration.nodeagent.test_agent import Scene, make_scene

SECTION = "progress reports"


@pytest.fixture
def servers() -> Iterator[metadata.Threaded]:
    threaded = metadata.Threaded()
    yield threaded
    threaded.close()


@pytest.fixture
def quiet_scene(
    devcluster: Devcluster, namespace: str, servers: metadata.Threaded, tmp_path: Path
) -> Iterator[Scene]:
    yield from make_scene(devcluster, namespace, servers, tmp_path, "none", extra=["--gpu", "off"])


@pytest.fixture
def aws_scene(
    devcluster: Devcluster, namespace: str, servers: metadata.Threaded, tmp_path: Path
) -> Iterator[Scene]:
    yield from make_scene(devcluster, namespace, servers, tmp_path, "aws", extra=["--gpu", "off"])


def progress(scene: Scene, pod: str) -> Progress | None:
    text = (scene.pod(pod).metadata.annotations or {}).get(names.PROGRESS_ANNOTATION)
    return None if text is None else decode(text)


def writes(scene: Scene) -> float:
    found = re.search(
        r'^shoal_agent_progress_writes_total\{result="written"\} (\S+)$',
        scene.agent.metrics(),
        re.MULTILINE,
    )
    return float(found.group(1)) if found else 0.0


def test_a_report_reaches_the_pod_and_a_burst_costs_one_later_write_of_the_newest(
    quiet_scene: Scene,
) -> None:
    scene = quiet_scene
    reporter = ProgressReporter(
        NoticeClient(scene.pods["trainer-0"], scene.agent.socket_path), interval=0.05
    )
    try:
        sent = time.monotonic()
        reporter.report(
            100,
            step_seconds=0.8,
            checkpoint_step=50,
            checkpoint_at=time.time(),
            checkpoint_seconds=20.0,
        )
        first = eventually(lambda: progress(scene, "trainer-0"), what="the first report")
        heard = time.monotonic() - sent
        assert (first.step, first.checkpoint_step, first.checkpoint_seconds) == (100, 50, 20.0)
        assert first.checkpoint_at is not None
        assert writes(scene) == 1

        for step in range(101, 121):  # a burst: twenty reports within a second or two
            reporter.report(step, step_seconds=0.8, checkpoint_step=110 if step >= 110 else 50)
        eventually(lambda: reporter.sent >= 2, what="the burst reached the agent")
        seen: list[tuple[float, int]] = []

        def newest() -> Progress | None:
            now = progress(scene, "trainer-0")
            assert now is not None
            seen.append((time.monotonic() - sent, now.step))
            return now if now.step != 100 else None

        second = eventually(newest, timeout=MIN_WRITE_INTERVAL_S + 45, what="the newest report")
        after = seen[-1][0]
    finally:
        reporter.close()
    # The newest values, no sooner than a minute after the first report.
    assert (second.step, second.checkpoint_step, second.checkpoint_at) == (120, 110, None)
    assert after >= MIN_WRITE_INTERVAL_S
    assert all(step == 100 for at, step in seen if at < MIN_WRITE_INTERVAL_S)
    assert writes(scene) == 2
    figures.record(SECTION, "first report: seconds until it is on the pod", round(heard, 2))
    figures.record(SECTION, "burst: seconds until the newest is on the pod", round(after, 2))


def test_a_worker_that_never_reports_still_hears_its_notice_beside_one_that_does(
    aws_scene: Scene,
) -> None:
    scene = aws_scene
    old_style = scene.worker("trainer-0")  # watches and acknowledges only, as before 0.2.0
    reporter = ProgressReporter(NoticeClient(scene.pods["trainer-0"], scene.agent.socket_path))
    try:
        assert old_style.next().state == "none"
        reporter.report(7, step_seconds=1.0)
        eventually(lambda: progress(scene, "trainer-0"), what="the report on the pod")
        scene.cloud.renew(timedelta(minutes=10))
        scene.cloud.post()
        told = old_style.until("leave")
        assert told.leave_by is not None
        assert old_style.acknowledge(7) == "accepted"
    finally:
        reporter.close()
        old_style.close()
