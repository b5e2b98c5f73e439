"""The torch helper reports progress on its own: every step it hears of through
``StopStep.check`` and every checkpoint it takes (or is told of), with the measured step and
checkpoint times, from local rank 0 of each pod."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch.distributed as dist
from shoal_worker.distributed import StopStep
from shoal_worker.progress import ProgressReporter, Report

from tests import waiting


class Client:
    def __init__(self) -> None:
        self.reports: list[Report] = []

    async def report_progress(self, report: Report) -> bool:
        self.reports.append(report)
        return True


@pytest.fixture
def group(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.usefixtures("group")
def test_the_torch_helper_reports_steps_and_complete_checkpoints_on_its_own() -> None:
    client = Client()
    reporter = ProgressReporter(client, interval=0.0)  # type: ignore[arg-type]
    with StopStep(None, progress=reporter, checkpoint_seconds=30.0, last_checkpoint=-1) as stop:
        for step in range(3):
            assert stop.check(step) is None
        waiting.eventually(lambda: client.reports, timeout=10, what="the first report")
        first = client.reports[0]
        # The reporter sends the newest step it has when its thread runs: any of the three.
        # No checkpoint yet: the declared checkpoint time stands.
        assert first.step in {0, 1, 2}
        assert (first.checkpoint_step, first.checkpoint_at) == (0, None)
        assert first.checkpoint_seconds == 30.0
        before = time.time()
        stop.checkpoint(2, lambda s: time.sleep(0.05))
        for step in (3, 4):
            stop.check(step)
        last = waiting.eventually(
            lambda: [r for r in client.reports if r.step == 4], timeout=10, what="step 4"
        )[-1]
    assert last.checkpoint_step == 2
    assert last.checkpoint_at is not None
    assert before <= last.checkpoint_at <= time.time()
    assert 0.05 <= last.checkpoint_seconds < 30.0  # measured now, not declared
    assert last.step_seconds > 0.0


@pytest.mark.usefixtures("group")
def test_only_the_pods_first_local_rank_reports(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "train")
    monkeypatch.setenv("POD_NAME", "worker-0")
    monkeypatch.setenv("POD_UID", "uid-0")
    monkeypatch.setenv("SHOAL_SOCKET", str(tmp_path / "absent.sock"))
    monkeypatch.setenv("LOCAL_RANK", "1")
    with StopStep.from_env() as other:
        assert other.progress is None
    monkeypatch.setenv("LOCAL_RANK", "0")
    with StopStep.from_env() as first:
        assert first.progress is not None
