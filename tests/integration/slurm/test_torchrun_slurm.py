"""Real torchrun training on the real Slurm cluster, every node running the node agent: a batch
job (``--nodes=2-3``) launches one torchrun per node with ``srun``, the ranks (gloo, over the
nodes' own addresses) use the worker library's torch helper (``demo/trainer.py`` with
``shoal_worker.distributed.StopStep``), and a spot notice on one node stops every rank at one
step, the checkpoint of that step is saved in a folder all nodes share, the node is drained with
the agent's reason, the agent requeues the job once the leaving rank acknowledged, and Slurm
starts it again on the two nodes left, from the next step: no step is lost, and every loss is
the loss of a run that never stopped. The notice withdrawn resumes the node.

Each node's agent reads a fake cloud of its own (``agents_on`` in ``conftest.py``) and serves
its socket in a folder of its own (the nodes share one filesystem here, where real nodes would
each have ``/run/shoal/agent.sock``); the per-node launcher picks it by ``SLURMD_NODENAME``.

:class:`TorchrunJob` is the whole scene without pytest's fixtures: ``bench/slurm_notices.py``
repeats it to measure notice to every rank stopped and notice to the job training again.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from shoal_worker.distributed import latest_checkpoint

from fakes import metadata
from fakes.clouds import Aws, Cloud
from slurmcluster import cluster
from tests import figures
from tests.integration.slurm.conftest import (
    CHECKOUT,
    FINAL,
    SlurmAgent,
    agents_on,
    job_info,
    lines,
    node_info,
    sbatch,
)
from tests.unit.worker.torchjob import Job
from tests.waiting import TRAINING_TIMEOUT, eventually

pytestmark = pytest.mark.timeout(TRAINING_TIMEOUT)

SECTION = "torchrun on Slurm"
NODES = ("sn0", "sn1", "sn2")
LEAVER = "sn1"
TRAINER = CHECKOUT / "demo" / "trainer.py"
#: Time for three torchruns to import torch and meet on a busy two-core machine.
SLOW = 180

#: One torchrun per node, started on each node of the step by ``srun``. The first node of the
#: allocation hosts the rendezvous; every address is the node's ``NodeAddr`` (the nodes' names
#: do not resolve). The notice socket is the node's own agent's.
LAUNCH = """\
#!/bin/sh
addr() {{ scontrol -o show node "$1" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p'; }}
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
host=false
[ "$SLURMD_NODENAME" = "$head" ] && host=true
run=${{SLURM_RESTART_COUNT:-0}}
unset POD_NAMESPACE POD_NAME POD_UID SHOAL_LEAVE_BY_FILE
export SHOAL_SOCKET={agents}/$SLURMD_NODENAME/agent.sock
exec {python} -m torch.distributed.run --nnodes="$SLURM_STEP_NUM_NODES" --nproc-per-node=1 \\
  --rdzv-backend=c10d --rdzv-endpoint="$(addr "$head"):$((29400 + run))" \\
  --rdzv-id="$SLURM_JOB_ID.$run" --rdzv-conf="is_host=$host" \\
  --local-addr="$(addr "$SLURMD_NODENAME")" --max-restarts=0 --monitor-interval=0.1 \\
  {trainer} --ckpt={folder}/ckpt --records={folder}/train.jsonl --steps={steps} \\
  --seed={seed} --step-seconds={step_seconds} --eviction-wait=600
"""

#: The batch script: one step across the job's nodes (three at first, two once requeued). The
#: leaving rank waits for the requeue to stop it (``--eviction-wait``), so that nothing of the
#: first run ends before Slurm takes the job back.
BATCH = """\
echo "run ${{SLURM_RESTART_COUNT:-0}} $SLURM_JOB_NODELIST" >> {folder}/runs.txt
srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 sh {folder}/launch.sh
echo "srun exited $?" >> {folder}/runs.txt
"""


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True, slots=True)
class Outcome:
    """One notice, as the records say: when it was posted, when the last rank knew the agreed
    stop step, when the checkpoint of that step was complete, when the agent requeued the job,
    and when the job trained its first step on the nodes left (seconds since the epoch)."""

    leaver: str
    stop_step: int
    posted: float
    stopped: float
    checkpointed: float
    requeued: float
    running_again: float

    def intervals(self) -> dict[str, float]:
        return {
            "notice -> every rank stopped": self.stopped - self.posted,
            "notice -> checkpoint complete": self.checkpointed - self.posted,
            "notice -> job requeued": self.requeued - self.posted,
            "notice -> training again on the nodes left": self.running_again - self.posted,
        }


@dataclass
class TorchrunJob:
    """The training job of this scene, in ``folder``; the agents' folders under ``agents``."""

    slurm: cluster.Cluster
    folder: Path
    agents: Path
    steps: int = 200
    seed: int = 7
    step_seconds: float = 0.1
    job: str = ""

    @property
    def ckpt(self) -> Path:
        return self.folder / "ckpt"

    @property
    def log(self) -> Path:
        return self.folder / "train.jsonl"

    def submit(self) -> str:
        self.folder.mkdir(parents=True, exist_ok=True)
        launch = LAUNCH.format(
            agents=self.agents,
            python=sys.executable,
            trainer=TRAINER,
            folder=self.folder,
            steps=self.steps,
            seed=self.seed,
            step_seconds=self.step_seconds,
        )
        (self.folder / "launch.sh").write_text(launch)
        env = {
            "PYTHONPATH": str(CHECKOUT),
            "OMP_NUM_THREADS": "1",
            "GLOO_SOCKET_IFNAME": "eth0",  # each node's one interface (its name in its namespace)
            "LOGLEVEL": "WARNING",
        }
        exports = ",".join(f"{k}={v}" for k, v in env.items())
        self.job = sbatch(
            self.slurm,
            self.folder,
            # A node range and no task count: Slurm gives the job every node it can (with
            # --ntasks-per-node, the task count it derives from the minimum would cap it at two).
            "--nodes=2-3",
            "--requeue",
            "--open-mode=append",
            f"--export=ALL,{exports}",
            script=BATCH.format(folder=self.folder),
        )
        return self.job

    def records(self, event: str | None = None) -> list[dict[str, Any]]:
        found = []
        for line in lines(self.log):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line being written
                continue
            if event is None or row["event"] == event:
                found.append(row)
        return found

    def _alive(self) -> None:
        """Fail at once when the job ended (its output says why)."""
        state = job_info(self.slurm, self.job).get("JobState", "")
        if state in FINAL:
            out = self.folder / f"job-{self.job}.out"
            said = out.read_text()[-3000:] if out.exists() else ""
            pytest.fail(f"job {self.job} ended ({state}) while training:\n{said}")

    def trained(self, world: int, through: int) -> bool:
        """Every rank of a world of ``world`` has trained step ``through``."""
        ranks = {
            r["rank"] for r in self.records("step") if r["world"] == world and r["step"] >= through
        }
        return ranks == set(range(world))

    def wait_training(self, agents: Mapping[str, SlurmAgent], world: int = 3) -> None:
        """Until the ranks train together and each node's agent admitted its step's watch."""

        def training() -> bool:
            self._alive()
            return self.trained(world, 2) and all(a.watching(self.job) for a in agents.values())

        eventually(training, timeout=SLOW, what=f"three ranks training ({self.folder})")

    def notice(self, cloud: Cloud, agent: SlurmAgent) -> Outcome:
        """Post a spot notice on ``agent``'s node; wait until every rank stopped and the job
        trains again on the nodes left; check what was stopped and resumed."""
        leaver = agent.node.name
        cloud.renew()
        posted = time.time()
        cloud.post()

        def stopped() -> list[dict[str, Any]] | None:
            stops = self.records("stop")
            return stops if len(stops) >= len(NODES) else None

        stops = eventually(stopped, timeout=SLOW, what=f"every rank stopped ({self.folder})")
        [stop_step] = {int(r["step"]) for r in stops}
        assert sorted(r["rank"] for r in stops) == [0, 1, 2], stops
        assert {r["node"]: r["leaving"] for r in stops} == {n: n == leaver for n in NODES}

        def again() -> bool:
            self._alive()
            return self.trained(2, stop_step + 1)

        eventually(
            again,
            timeout=cluster.CRED_EXPIRE_S + SLOW,
            what=f"the job training again on two nodes ({self.folder}, {agent.log_path})",
        )
        steps = self.records("step")
        [requeued] = [e for e in agent.logged("slurm_job_requeued") if e.get("job") == self.job]
        metadata_file = self.ckpt / f"step-{stop_step}" / ".metadata"
        return Outcome(
            leaver=leaver,
            stop_step=stop_step,
            posted=posted,
            stopped=max(float(r["t"]) for r in stops),
            checkpointed=metadata_file.stat().st_mtime,
            requeued=_stamp(requeued["timestamp"]),
            running_again=min(
                float(r["t"]) for r in steps if r["world"] == 2 and r["step"] == stop_step + 1
            ),
        )

    def withdraw(self, cloud: Cloud, agent: SlurmAgent) -> None:
        """Withdraw the notice; wait until the agent resumed its node."""
        cloud.withdraw()
        node = agent.node.name

        def resumed() -> dict[str, str] | None:
            info = node_info(self.slurm, node)
            return info if "DRAIN" not in info.get("State", "DRAIN") else None

        eventually(resumed, timeout=60, what=f"{node} resumed after the withdrawal")


@pytest.fixture
def clouds() -> Iterator[dict[str, Aws]]:
    servers = metadata.Threaded()
    yield {name: Aws(servers) for name in NODES}
    servers.close()


@pytest.fixture
def agents(
    slurm_cluster: cluster.Cluster, clouds: dict[str, Aws], tmp_path: Path
) -> Iterator[dict[str, SlurmAgent]]:
    """The agent (requeue, its default) on every node."""
    servers = next(iter(clouds.values())).servers
    with agents_on(slurm_cluster, clouds, servers, tmp_path / "agents") as running:
        yield running


def test_a_spot_notice_stops_every_rank_at_one_step_and_the_requeued_job_goes_on_from_the_next(
    slurm_cluster: cluster.Cluster,
    agents: dict[str, SlurmAgent],
    clouds: dict[str, Aws],
    tmp_path: Path,
) -> None:
    job = TorchrunJob(slurm_cluster, tmp_path / "job", tmp_path / "agents")
    job.submit()
    job.wait_training(agents)
    cloud, agent = clouds[LEAVER], agents[LEAVER]

    outcome = job.notice(cloud, agent)
    stop_step = outcome.stop_step

    # The node was drained with the agent's reason, and the job requeued because the leaving
    # rank acknowledged the complete checkpoint (not at the margin).
    info = node_info(slurm_cluster, LEAVER)
    assert "DRAIN" in info["State"], info
    assert info["Reason"].startswith(f"shoal: aws terminate until {cloud.time}"), info
    [drained] = agent.logged("slurm_node_drained")
    [told] = agent.logged("slurm_job_told")
    assert info["Reason"].startswith(drained["reason"]), (info, drained)
    assert told["job"] == job.job, told
    [acked] = agent.logged("worker_acknowledged")
    assert (acked["step"], acked["outcome"]) == (stop_step, "accepted"), acked
    [requeued] = agent.logged("slurm_job_requeued")
    assert (requeued["job"], requeued["why"]) == (job.job, "acknowledged"), requeued
    assert requeued["timestamp"] >= acked["timestamp"]
    assert latest_checkpoint(job.ckpt) == (stop_step, job.ckpt / f"step-{stop_step}")
    # Nothing was handed back elsewhere: the other agents' jobs were never told.
    for name in set(NODES) - {LEAVER}:
        assert not agents[name].logged("slurm_job_told"), name

    # Requeued by the agent, and running again on the two nodes left.
    found = job_info(slurm_cluster, job.job)
    assert found["Restarts"] == "1", found
    assert found["AdminComment"].startswith(f"shoal: requeued off {LEAVER}: aws terminate"), found
    kept = slurm_cluster.run(["scontrol", "show", "hostnames", found["NodeList"]]).stdout.split()
    assert sorted(kept) == ["sn0", "sn2"], found

    # The notice withdrawn: the node takes jobs again.
    job.withdraw(cloud, agent)
    assert agent.logged("slurm_node_resumed")

    # The second run trains to the end on two nodes; every step is trained once per run, none
    # is lost, and every loss is that of a run that never stopped.
    def done() -> dict[str, str] | None:
        info = job_info(slurm_cluster, job.job)
        return info if info.get("JobState") in FINAL else None

    ended = eventually(done, timeout=SLOW, what=f"job {job.job} to finish ({job.folder})")
    assert ended["JobState"] == "COMPLETED", ended
    starts = job.records("start")
    assert sorted((r["world"], r["step"], r["node"]) for r in starts) == sorted(
        [(3, 0, n) for n in NODES] + [(2, stop_step + 1, n) for n in kept]
    )
    steps = job.records("step")
    for world, first, last in ((3, 0, stop_step), (2, stop_step + 1, job.steps - 1)):
        for rank in range(world):
            trained = [r["step"] for r in steps if r["world"] == world and r["rank"] == rank]
            assert trained == list(range(first, last + 1)), (world, rank)
    assert len(job.records("done")) == 2
    reference = Job(tmp_path, steps=job.steps, seed=job.seed, step_seconds=0).reference()
    assert sorted(reference) == list(range(job.steps))
    assert [r for r in steps if r["loss"] != reference[r["step"]]] == []

    for name, seconds in outcome.intervals().items():
        figures.record(SECTION, f"{name} (s)", round(seconds, 3))
