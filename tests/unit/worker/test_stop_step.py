"""A pod of a three-pod torchrun job is told to leave: every rank stops at the same step, the
checkpoint at that step is complete, the leaving pod acknowledges it, and the two pods left go
on from the next step with the losses of a run that never stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from shoal_worker.distributed import latest_checkpoint

from tests.unit.nodeagent.notice_socket import notice
from tests.unit.worker.torchjob import (
    Job,
    KubeletCluster,
    agent_for,
    rendezvous_store,
    running,
    wait_for,
)

LEAVER = "worker-0"
STAYERS = ["worker-1", "worker-2"]


def test_one_pod_told_to_leave_stops_every_rank_at_one_step(tmp_path: Path) -> None:
    job = Job(tmp_path, eviction_wait=600.0)
    store = rendezvous_store()
    leaving_node = agent_for(tmp_path / "a.sock", [LEAVER])
    other_node = agent_for(tmp_path / "b.sock", STAYERS)
    with running(leaving_node), running(other_node):
        try:
            leaver = job.launch(LEAVER, leaving_node, store.port, "1:3")
            assert isinstance(leaving_node.cluster, KubeletCluster)
            leaving_node.cluster.launchers[LEAVER] = leaver.process
            stayers = [job.launch(pod, other_node, store.port, "1:3") for pod in STAYERS]
            wait_for(
                lambda: [r for r in job.records("step") if r["world"] == 3 and r["step"] >= 3],
                "the three pods train together",
                job,
            )
            leaving_node.observe([notice()])

            stops = wait_for(lambda: _stops_of_world(job, 3), "every rank stopped", job)
            [stop_step] = {int(r["step"]) for r in stops}
            assert {r["pod"]: r["leaving"] for r in stops} == {
                LEAVER: True,
                "worker-1": False,
                "worker-2": False,
            }
            acked = wait_for(
                lambda: (
                    leaving_node.acked()[f"train/{LEAVER}"] is not None and leaving_node.acked()
                ),
                "the leaving pod acknowledged",
                job,
            )
            assert acked == {f"train/{LEAVER}": stop_step}
            # Acknowledged only once every rank had saved: the checkpoint is complete.
            assert latest_checkpoint(job.ckpt) == (stop_step, job.ckpt / f"step-{stop_step}")

            for launcher in stayers:
                assert launcher.process.wait(90) == 0, job.outputs()
            # Evicted once acknowledged: the kubelet's SIGTERM stopped its torchrun, which
            # left the rendezvous open for the others.
            assert leaver.process.wait(30) != 0
            assert [key for key, _ in leaving_node.cluster.evicted] == [f"train/{LEAVER}"]
        finally:
            job.stop()

    starts = job.records("start")
    resumed = [r for r in starts if r["step"] == stop_step + 1]
    assert sorted(r["pod"] for r in resumed) == STAYERS
    assert {r["world"] for r in resumed} == {2}
    assert not [r for r in starts if r["pod"] == LEAVER and r["step"] > 0]

    # Every step trained exactly once in the resumed job, and each loss is the uninterrupted one.
    reference = job.reference()
    losses = {(r["step"], r["rank"]): r["loss"] for r in job.records("step")}
    after = {step: loss for (step, _), loss in losses.items() if step > stop_step}
    assert sorted(after) == list(range(stop_step + 1, job.steps))
    assert after == {step: reference[step] for step in after}
    assert {loss for (step, _), loss in losses.items() if step == stop_step} == {
        reference[stop_step]
    }


def _stops_of_world(job: Job, world: int) -> list[dict[str, Any]]:
    stops = job.records("stop")
    return stops if len(stops) >= world else []
