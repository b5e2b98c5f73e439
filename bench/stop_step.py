"""Worker library benchmark: a three-pod torchrun job on loopback, told ``--notices`` times that
one of its pods must leave; each time a new pod takes the place of the one that left.

Per notice, measured from the moment the agent hears it (``observe``):

- stopped: until the last rank has returned the agreed stop step from ``StopStep.check``;
- checkpoint + ack: from that moment until the agent holds the leaving pod's acknowledgement
  (``torch.distributed.checkpoint`` save on every rank, then ``Acknowledge``);
- launcher exit: until the leaving pod's torchrun has exited;
- resumed: from the leaving torchrun's exit until the two remaining pods log their first step
  after the checkpoint (re-rendezvous without it, restart, ``resume()``).

Real torchrun launchers (gloo, CPU, one worker per pod), the real notice service on unix
sockets. Training steps take about 50 ms, so "stopped" includes up to one step.

    PYTHONPATH=. .venv/bin/python bench/stop_step.py [--notices 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from tests.unit.nodeagent.notice_socket import notice
from tests.unit.worker.torchjob import Job, agent_for, rendezvous_store, running, wait_for

STAYERS = ["worker-a", "worker-b"]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def one_notice(job: Job, round_: int, port: int, tmp: Path) -> dict[str, float]:
    pod = f"leaver-{round_}"
    node = agent_for(tmp / f"leaver-{round_}.sock", [pod])
    with running(node):
        launcher = job.launch(pod, node, port, "1:3")
        seen = len(job.records("stop"))
        wait_for(
            lambda: [r for r in job.records("step") if r["pod"] == pod and r["world"] == 3],
            f"{pod} trains with the others",
            job,
        )
        time.sleep(0.5)
        heard = time.time()
        node.observe([notice(f"spot-{round_}")])
        stops = wait_for(
            lambda: len(job.records("stop")) >= seen + 3 and job.records("stop")[seen:],
            "every rank stopped",
            job,
        )
        stopped = max(r["t"] for r in stops)
        step = stops[0]["step"]
        wait_for(lambda: node.acked()[f"train/{pod}"] == step, "the acknowledgement", job)
        acked = time.time()
        launcher.process.wait(120)
        left = time.time()
        resumed = wait_for(
            lambda: [
                r
                for r in job.records("step")
                if r["step"] == step + 1 and r["pod"] in STAYERS and r["t"] > stopped
            ],
            "the remaining pods resumed",
            job,
        )
    return {
        "stopped": stopped - heard,
        "checkpoint + ack": acked - stopped,
        "launcher exit": left - heard,
        "resumed": min(r["t"] for r in resumed) - left,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--notices", type=int, default=20)
    p.add_argument("--folder", help="keep the launchers' logs and records here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="stop-step-") as scratch:
        tmp = Path(args.folder or scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        job = Job(tmp, steps=1_000_000, max_restarts=10 * args.notices)
        store = rendezvous_store()
        stay = agent_for(tmp / "stay.sock", STAYERS)
        rounds: list[dict[str, float]] = []
        with running(stay):
            try:
                for pod in STAYERS:
                    job.launch(pod, stay, store.port, "1:3")
                for n in range(args.notices):
                    rounds.append(one_notice(job, n, store.port, tmp))
                    print(n, {k: round(v, 3) for k, v in rounds[-1].items()}, flush=True)
            finally:
                job.stop()
    print(f"\n{len(rounds)} notices, three pods of one rank each, gloo on loopback")
    print("| from the notice | p50 | p99 | max |")
    print("|---|---|---|---|")
    for key in rounds[0]:
        values = [r[key] for r in rounds]
        p50, p99 = statistics.median(values), percentile(values, 0.99)
        print(f"| {key} | {p50:.2f} s | {p99:.2f} s | {max(values):.2f} s |")


if __name__ == "__main__":
    main()
