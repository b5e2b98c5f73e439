"""Real torchrun training admitted by the real Kueue (v0.17.0; ``tests/integration/kueue.py``),
placed by Shoal, preempted by Kueue, and resumed with no step lost.

A ``batch/v1`` Job of two pods, each a torchrun launcher with one rank of ``demo/trainer.py``
(8 GPUs a pod, one gang for Shoal), is admitted in a ClusterQueue of 16 GPUs that preempts by
priority (``withinClusterQueue: LowerPriority``); :mod:`fakes.runtime` runs each bound pod's
command as real processes. A Job of higher priority in the same ClusterQueue then needs 8 of those
GPUs: Kueue marks the training Workload ``Evicted`` (``Preempted``, reason ``InClusterQueue``)
and suspends the Job, whose controller deletes its pods. Nothing else tells the workers: there is
no Shoal agent here, and Kueue gives no earlier signal (docs/kueue.md). Each launcher gets SIGTERM
from the pod's deletion and passes it to its rank; the ranks agree on one step, save a complete
checkpoint of it and exit, within the pods' grace period (60 s) and before any SIGKILL. Once the
preemptor is deactivated, Kueue admits the training Job again, its controller creates new pods,
Shoal binds them whole, and the new ranks resume at the step after the checkpoint and train to
the end with the losses of a run that never stopped.

No step is lost: from the ranks' own records, no rank trained a step past the checkpoint before
it left, and the resumed ranks started right after it."""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Collection, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from shoal_worker.distributed import latest_checkpoint

from contracts import names
from devcluster.ports import free_port
from fakes.runtime import Runtime
from tests import figures
from tests.integration import kueue
from tests.integration.history import History

# The module's own control plane with Kueue, its namespaces and queues (pytest fixtures).
from tests.integration.kueue import (  # noqa: F401
    Queues,
    kueue_devcluster,
    kueue_namespace,
    kueue_queues,
    kueue_running,
    kueue_webhook_network,
    kueue_workload_history,
)
from tests.integration.scheduler.conftest import (
    Pods,
    Pool,
    SchedulerProcess,
    ensure_priority_class,
)
from tests.unit.worker.torchjob import ROOT, Job
from tests.waiting import TRAINING_TIMEOUT, eventually

_UNAVAILABLE = kueue.unavailable()
pytestmark = [
    pytest.mark.skipif(_UNAVAILABLE is not None, reason=_UNAVAILABLE or ""),
    pytest.mark.timeout(TRAINING_TIMEOUT),
]

SECTION = "torchrun under Kueue"
TRAIN, URGENT = "train", "urgent"
HIGH = "shoal-test-kueue-high"
WORKERS, GPUS = 2, 8
#: The pods' terminationGracePeriodSeconds: the time a rank has to save once told.
GRACE = 60
#: Time for ranks and launchers on a busy two-core machine.
SLOW = 180


@pytest.fixture
def runtime_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="shoal-kq-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def trainer_job(pods: Pods, queue: str, job: Job, port: int) -> dict[str, Any]:
    """The training Job: two pods, each torchrun with one rank; the c10d rendezvous on
    ``127.0.0.1:port`` is hosted by whichever launcher binds it first (every one tries: the
    address is this machine's), so it goes with the pods and the next run starts afresh."""
    rdzv = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=5"
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={WORKERS}",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=kueue",
        f"--rdzv-conf={rdzv}",
        f"--max-restarts={job.max_restarts}",
        "--monitor-interval=0.1",
    ]
    env = [
        {"name": "PYTHONPATH", "value": str(ROOT)},
        {"name": "OMP_NUM_THREADS", "value": "1"},
        {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"},
        {"name": "LOGLEVEL", "value": "WARNING"},
        # The trainer's records name the pod; no notice socket here (no agent), so the pod's
        # namespace and uid, which the notice client needs, are left out.
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    spec = kueue.worker(pods, GPUS)
    spec["terminationGracePeriodSeconds"] = GRACE
    spec["containers"][0].update(command=torchrun, args=job.trainer_args(), env=env)
    # Pods deleted by the suspension count as failed: room for them and the runs after.
    return kueue.job(pods, queue, TRAIN, size=WORKERS, gpus=GPUS, spec=spec, backoff_limit=20)


def _pods_of(records: list[dict[str, Any]], pods: set[str]) -> list[dict[str, Any]]:
    return [r for r in records if r["pod"] in pods]


def _every_rank(
    job: Job, event: str, pods: set[str] | None, *, but: Collection[str] = ()
) -> list[dict[str, Any]] | None:
    """The ``event`` records of the ranks of ``pods`` (any pod but those in ``but`` when
    None), once there is one per rank."""
    found = [
        r for r in job.records(event) if (pods is None or r["pod"] in pods) and r["pod"] not in but
    ]
    return found if len(found) >= WORKERS else None


def _seconds(stamp: str) -> float:
    """An API time (RFC 3339, to the second) in seconds since the epoch."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _deadline(versions: list[Any]) -> float:
    """When a deleted pod's grace period ended (its ``deletionTimestamp``: the deletion's time
    plus the grace period), in seconds since the epoch, from its recorded versions."""
    stamp = next(v.metadata.deletion_timestamp for v in versions if v.metadata.deletion_timestamp)
    assert isinstance(stamp, datetime), stamp
    return stamp.timestamp()


def test_a_torchrun_job_preempted_by_kueue_saves_on_sigterm_and_resumes_losing_no_step(
    queues: Queues,
    pool: Pool,
    *,
    scheduler_name: str,
    start_scheduler: Callable[..., SchedulerProcess],
    pod_history: History,
    workload_history: History,
    runtime_root: Path,
    tmp_path: Path,
) -> None:
    devcluster = pool.devcluster
    namespace = queues.namespace
    pods = Pods(devcluster, namespace, scheduler_name, pool.pool)
    nodes = pool.add(2, gpus=8)  # 16 GPUs: the training Job fills them
    queue = queues.make(2 * GPUS, preemption={"withinClusterQueue": "LowerPriority"})
    ensure_priority_class(devcluster, HIGH, 1000)
    start_scheduler()
    job = Job(tmp_path / "job", steps=600, step_seconds=0.05)
    job.tmp.mkdir()
    reference = Job(tmp_path / "reference", steps=job.steps, step_seconds=0.0, seed=job.seed)
    reference.tmp.mkdir()
    expected = reference.reference()
    runtime = Runtime(
        devcluster.kubeconfig,
        namespace,
        nodes,
        runtime_root,
        selector=f"{names.GANG_LABEL}={TRAIN}",
    ).start()
    try:
        _story(
            pods,
            queue,
            job=job,
            expected=expected,
            runtime=runtime,
            pod_history=pod_history,
            workload_history=workload_history,
        )
    finally:
        runtime.close()


def _story(
    pods: Pods,
    queue: str,
    *,
    job: Job,
    expected: dict[int, float],
    runtime: Runtime,
    pod_history: History,
    workload_history: History,
) -> None:
    devcluster, namespace = pods.devcluster, pods.namespace
    train = devcluster.batch().create_namespaced_job(
        namespace, trainer_job(pods, queue, job, free_port())
    )
    eventually(
        lambda: [r for r in job.records("step") if r["world"] == WORKERS and r["step"] >= 3],
        timeout=SLOW,
        what=f"the two pods to train together ({job.log})",
    )
    first = {r["pod"] for r in job.records("start")}
    assert len(first) == WORKERS, first

    # The preemptor: a Job of higher priority in the same ClusterQueue, needing 8 of the 16 GPUs.
    urgent = kueue.job(pods, queue, URGENT, size=1, gpus=GPUS)
    urgent["spec"]["template"]["spec"]["priorityClassName"] = HIGH
    urgent_job = devcluster.batch().create_namespaced_job(namespace, urgent)

    def preempted() -> dict[str, Any] | None:
        for state in workload_history.states():
            for workload in state.values():
                condition = kueue.condition(workload, "Preempted")
                if (
                    train.metadata.uid in kueue.owners(workload)
                    and condition is not None
                    and condition["status"] == "True"
                ):
                    found: dict[str, Any] = workload
                    return found
        return None

    workload = eventually(preempted, timeout=SLOW, what="Kueue to preempt the training Job")
    assert (kueue.condition(workload, "Preempted") or {}).get("reason") == "InClusterQueue"
    evicted = kueue.condition(workload, "Evicted")
    assert evicted is not None
    assert evicted["reason"] == "Preempted", evicted

    restarts = eventually(
        lambda: _every_rank(job, "restart", first),
        timeout=SLOW,
        what="every rank to save and stop on SIGTERM",
    )

    def launchers_out() -> dict[str, int] | None:
        codes = {key.split("/", 1)[1]: c.get("worker") for key, c in runtime.exit_codes().items()}
        mine = {pod: codes.get(pod) for pod in first}
        if any(code is None for code in mine.values()):
            return None
        return {pod: int(code) for pod, code in mine.items() if code is not None}

    codes = eventually(launchers_out, timeout=SLOW, what="both torchrun launchers to exit")
    eventually(
        lambda: len(kueue.bound_of_job(pods, URGENT)) == 1,
        timeout=SLOW,
        what="the preemptor admitted and bound",
    )

    # Give the quota back: Kueue admits the training Job again, its controller makes new pods.
    kueue.deactivate(devcluster, namespace, urgent_job.metadata.uid)
    done = eventually(
        lambda: _every_rank(job, "done", None, but=first),
        timeout=2 * SLOW,
        what=f"the resumed Job to train to the end ({job.log})",
    )
    second = {r["pod"] for r in done}

    # Told by the deletion, within its grace period: each rank saved before its pod's deadline,
    # and no launcher was killed (they exited on their own, after their ranks).
    pod_history.caught_up()
    deadlines = {name: _deadline(pod_history.versions(name)) for name in first}
    for record in restarts:
        assert record["t"] < deadlines[record["pod"]], (record, deadlines)
    assert any(r["signalled"] for r in restarts), restarts
    assert -signal.SIGKILL not in codes.values(), codes

    # No step lost: every rank stopped at one step S, whose checkpoint is complete; none trained
    # past it; the new ranks started at S + 1 and trained to the end as a run that never stopped.
    [stop] = {int(r["step"]) for r in restarts}
    assert latest_checkpoint(job.ckpt) == (stop, job.ckpt / f"step-{stop}")
    before = _pods_of(job.records("step"), first)
    trained = max(int(r["step"]) for r in before)
    lost = trained - stop
    assert lost == 0, f"steps {stop + 1} to {trained} were trained and not saved"
    starts = _pods_of(job.records("start"), second)
    assert {(r["step"], r["world"]) for r in starts} == {(stop + 1, WORKERS)}, starts
    after = _pods_of(job.records("step"), second)
    losses = {int(r["step"]): r["loss"] for r in [*before, *after]}
    assert sorted(losses) == list(range(job.steps)), "a step is missing"
    assert losses == expected
    assert stop < job.steps - 1

    partial = kueue.partly_bound(pod_history.states(), {TRAIN: WORKERS, URGENT: 1})
    assert not partial, f"gangs left partly bound: {partial}"
    figures.record(SECTION, "steps lost to a Kueue preemption", lost)
    figures.record(
        SECTION,
        "Workload evicted to the last rank's save (s, to the second)",
        round(max(float(r["t"]) for r in restarts) - _seconds(evicted["lastTransitionTime"]), 1),
    )
    figures.record(
        SECTION,
        "pod deadline minus the last rank's save (s)",
        round(min(deadlines.values()) - max(float(r["t"]) for r in restarts), 3),
    )
