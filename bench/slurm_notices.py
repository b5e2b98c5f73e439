"""Spot notices on the real Slurm cluster, with torchrun training across its three nodes.

Each round is the scene of ``tests/integration/slurm/test_torchrun_slurm.py``: a fresh batch job
(``--nodes=2-3``, one torchrun per node launched by ``srun``, the worker library's torch helper
in every rank) trains on ``sn0``-``sn2``, each node running the node agent (``--platform slurm``,
requeue, its default); a spot notice from the AWS metadata stand-in on one node (``sn0``,
``sn1``, ``sn2`` in turn, posted at a random phase against the agent's 1 s poll) stops every rank
at one step, the checkpoint is saved, the agent drains the node and requeues the job once the
leaving rank acknowledged, and Slurm starts it again on the two nodes left; then the notice is
withdrawn and the node resumed, the job cancelled, and the next round begins. The times come
from the trainer's records (every rank's stop, the first step trained again), the checkpoint's
metadata file and the agent's log line; the notice's is when it was written into the stand-in.

Needs what the Slurm tests need (root, ``ip``, ``make slurm``) and torch; starts its own cluster
and takes the machine's Slurm slot as a test session does.

    .venv/bin/python bench/slurm_notices.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from fakes import metadata
from fakes.clouds import Aws
from slurmcluster import cluster
from tests.integration.slurm.conftest import agents_on, reset, skip_reason
from tests.integration.slurm.test_torchrun_slurm import NODES, Outcome, TorchrunJob


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def rounds(slurm: cluster.Cluster, work: Path, count: int) -> list[Outcome]:
    servers = metadata.Threaded()
    outcomes: list[Outcome] = []
    try:
        clouds = {name: Aws(servers) for name in NODES}
        with agents_on(slurm, clouds, servers, work / "agents") as agents:
            for index in range(count):
                leaver = NODES[index % len(NODES)]
                job = TorchrunJob(slurm, work / f"job-{index}", work / "agents")
                job.submit()
                job.wait_training(agents)
                time.sleep(random.uniform(0.0, 1.0))  # noqa: S311 - a random phase against the poll
                outcome = job.notice(clouds[leaver], agents[leaver])
                job.withdraw(clouds[leaver], agents[leaver])
                reset(slurm)
                outcomes.append(outcome)
                said = ", ".join(f"{k} {v:.2f} s" for k, v in outcome.intervals().items())
                print(
                    f"round {index + 1}: {leaver} left after step {outcome.stop_step}: {said}",
                    flush=True,
                )
    finally:
        servers.close()
    return outcomes


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10, help="notices, one job each")
    args = p.parse_args()
    reason = skip_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="shoal-slb-"))  # short: the agents' sockets are in it
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    try:
        with cluster.one_at_a_time():
            slurm = cluster.up(work / "slurm", nodes=3, die_with_parent=True)
            try:
                outcomes = rounds(slurm, work, args.rounds)
            finally:
                cluster.down(work / "slurm")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{len(outcomes)} notices (seconds)    median    p90    max")
    for name in outcomes[0].intervals():
        values = [o.intervals()[name] for o in outcomes]
        print(
            f"{name:45} {percentile(values, 0.5):6.2f} {percentile(values, 0.9):6.2f} "
            f"{max(values):6.2f}"
        )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
