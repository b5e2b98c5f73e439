"""A torchrun trainer that moves through stages of different sizes and sets its own gang's
bounds as it goes (docs/workers.md, "Stages").

``--stages 2:8:cpu,4:8,2:8`` is three stages: 8 steps on 2 pods with a CPU-heavy preparation
of every batch, 8 steps on 4 pods, 8 steps on 2 pods. At the last step of a stage, global rank 0
writes the next stage's size as the gang's minimum and maximum (``shoal.dev/min-member`` and
``shoal.dev/max-member`` on every member pod: the rights of ``rbac.yaml`` in this folder), every
rank saves that step, and the job waits, training nothing, for Shoal to carry the change out:

- **Growing**: Shoal binds the members the raised bounds admit; their torchrun joins the
  rendezvous, which makes every torchrun restart its workers (SIGTERM) into a larger round.
- **Shrinking**: Shoal asks the youngest members above the lowered maximum to leave, through
  the node agent's notice; :class:`shoal_worker.distributed.StopStep` makes every rank agree on
  the step already saved, the leaving pods acknowledge it and are evicted, and the others
  restart into a smaller round.

A round whose size is not the size of the stage it is in trains nothing either (members joining
one at a time make such rounds): it waits for the next change. Every round resumes after the
last checkpoint, so no step is trained twice or skipped, and as every step trains on the same
global batch whatever the world size, the losses equal those of one process that never stopped
(run this file without torchrun for that run: a world of one, no API).

Each rank appends JSON lines to ``--records``: ``start`` (step, world, stage), ``step`` (step,
stage, world, loss, cpu: the process's CPU seconds for the step), ``bounds`` (the size written),
``stop`` (the agreed stop step of a notice), ``restart`` (torchrun restarts the round) and
``done``.

Needs ``shoal-worker[torch]`` and the ``kubernetes`` client (in-cluster credentials, or
``KUBECONFIG``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from shoal_worker.distributed import (
    EXIT_REJOIN,
    StopStep,
    latest_checkpoint,
    resume,
    save_checkpoint,
)
from torch import nn

MICRO = 12  # micro-batches per global batch: divisible by every world size of 1 to 4
BATCH = 4
WIDTH = 8
GANG_LABEL = "shoal.dev/gang"
MIN_MEMBER = "shoal.dev/min-member"
MAX_MEMBER = "shoal.dev/max-member"


@dataclass(frozen=True)
class Stage:
    members: int
    steps: int
    cpu_heavy: bool

    @staticmethod
    def parse(text: str) -> list[Stage]:
        stages = []
        for part in text.split(","):
            members, steps, *rest = part.split(":")
            stages.append(Stage(int(members), int(steps), rest == ["cpu"]))
        return stages


def stage_of(stages: list[Stage], step: int) -> int:
    """The index of the stage ``step`` belongs to (the last one past the end)."""
    end = 0
    for index, stage in enumerate(stages):
        end += stage.steps
        if step < end:
            return index
    return len(stages) - 1


def last_step(stages: list[Stage], index: int) -> int:
    return sum(s.steps for s in stages[: index + 1]) - 1


class Records:
    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, event: str, **fields: Any) -> None:
        line = {
            "event": event,
            "t": time.time(),
            "rank": dist.get_rank(),
            "pod": os.environ.get("POD_NAME", ""),
            **fields,
        }
        with open(self.path, "a") as out:
            out.write(json.dumps(line) + "\n")


class Bounds:
    """Writes the gang's minimum and maximum on every member pod: ``list`` and ``patch`` of
    pods in the pod's own namespace, nothing else (``rbac.yaml``)."""

    def __init__(self, gang: str) -> None:
        from kubernetes import client, config  # only the rank that writes needs it

        if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
            config.load_incluster_config()
        else:
            config.load_kube_config()
        self.core = client.CoreV1Api()
        self.namespace = os.environ["POD_NAMESPACE"]
        self.gang = gang

    def set(self, members: int) -> None:
        want = {MIN_MEMBER: str(members), MAX_MEMBER: str(members)}
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{GANG_LABEL}={self.gang}"
        ).items
        for pod in pods:
            notes = pod.metadata.annotations or {}
            if all(notes.get(k) == v for k, v in want.items()) or pod.metadata.deletion_timestamp:
                continue
            patch = {"metadata": {"annotations": want}}
            self.core.patch_namespaced_pod(pod.metadata.name, self.namespace, patch)


def model_and_optimizer(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(WIDTH, 16), nn.Tanh(), nn.Linear(16, 1))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def batch(seed: int, step: int, cpu_heavy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``; a CPU-heavy stage prepares it the long way (a stand-in
    for decoding and augmenting raw data), to the same values."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(MICRO, BATCH, WIDTH, generator=generator)
    if cpu_heavy:
        work = torch.randn(256, 256, generator=torch.Generator().manual_seed(step))
        for _ in range(100):
            work = torch.tanh(work @ work.T / 256)
        x = x + 0 * work.sum()
    return x, torch.sin(x.sum(-1, keepdim=True))


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> float:
    """One step on the global batch: each rank takes an equal share of the micro-batches, and
    their gradients are gathered and summed in micro-batch order on every rank, so the result
    is the same for every world size."""
    world, rank = dist.get_world_size(), dist.get_rank()
    params = list(model.parameters())
    share = MICRO // world
    rows = []
    for micro in range(rank * share, (rank + 1) * share):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x[micro]), y[micro])
        loss.backward()  # type: ignore[no-untyped-call]
        grads = [p.grad.reshape(-1) for p in params if p.grad is not None]
        rows.append(torch.cat([*grads, loss.detach().reshape(1)]))
    mine = torch.stack(rows)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    every = torch.cat(gathered)
    total = every[0].clone()
    for row in every[1:]:
        total += row
    mean = total / MICRO
    offset = 0
    for p in params:
        p.grad = mean[offset : offset + p.numel()].view_as(p).clone()
        offset += p.numel()
    optimizer.step()
    return float(mean[-1])


class Restarted:
    """Whether torchrun sent this rank SIGTERM (it restarts the round: a member joined or left)."""

    def __init__(self) -> None:
        self.heard = False
        signal.signal(signal.SIGTERM, self._heard)

    def _heard(self, signum: int, frame: object) -> None:
        self.heard = True

    def agreed(self) -> bool:
        """Whether any rank heard it (collective: every rank calls it as often)."""
        flag = torch.tensor([int(self.heard)], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


@dataclass
class Job:
    args: argparse.Namespace
    stages: list[Stage]
    record: Records
    model: nn.Module
    optimizer: torch.optim.Optimizer
    stopper: StopStep
    restarted: Restarted
    #: Under torchrun (else the reference run: no stages to wait for).
    elastic: bool
    #: Global rank 0's writer of the gang's bounds.
    bounds: Bounds | None

    def save(self, step: int) -> None:
        save_checkpoint(self.args.ckpt, step, self.model, self.optimizer)
        self.stopper.saved(step)

    def wait_for_change(self, saved: int) -> NoReturn:
        """Train nothing until the round ends: a notice (every rank stops at ``saved``, whose
        checkpoint is complete; the pods told leave) or torchrun restarting the round."""
        while True:
            if self.stopper.check(saved) is not None:
                assert self.stopper.stop is not None
                self.record("stop", step=saved, leaving=self.stopper.stop.leaving)
                self.stopper.leave(saved, self._saved_already)
            if self.restarted.agreed():
                self.record("restart", step=saved, signalled=self.restarted.heard)
                self.rejoin()
            time.sleep(0.1)

    def _saved_already(self, step: int) -> None:
        latest = latest_checkpoint(self.args.ckpt)
        if latest is None or latest[0] != step:
            self.save(step)

    def rejoin(self) -> NoReturn:
        dist.barrier()
        dist.destroy_process_group()
        # torchrun restarts the workers of a rank that asks for a new round (see
        # shoal_worker.distributed.EXIT_REJOIN).
        sys.exit(EXIT_REJOIN)

    def next_stage(self, step: int, stage: int) -> None:
        """After the last step of ``stage``: save it, write the next stage's bounds, wait."""
        members = self.stages[stage + 1].members
        self.save(step)
        if self.bounds is not None and dist.get_rank() == 0:
            self.bounds.set(members)
            self.record("bounds", step=step, members=members, stage=stage + 1)
        self.wait_for_change(step)

    def run(self, start: int) -> None:
        total = sum(s.steps for s in self.stages)
        world = dist.get_world_size()
        stage = stage_of(self.stages, start)
        self.record("start", step=start, world=world, stage=stage)
        if self.elastic and 0 < start < total and world != self.stages[stage].members:
            # A round of the wrong size: the next one comes. The bounds are written again (a
            # no-op once they are), in case a round ended between the save and the write.
            if self.bounds is not None:
                self.bounds.set(self.stages[stage].members)
            self.wait_for_change(start - 1)
        for step in range(start, total):
            stage = stage_of(self.stages, step)
            cpu = time.process_time()
            x, y = batch(self.args.seed, step, self.stages[stage].cpu_heavy)
            loss = train_step(self.model, self.optimizer, x, y)
            cpu = time.process_time() - cpu
            self.record("step", step=step, stage=stage, world=world, loss=loss, cpu=cpu)
            if self.stopper.check(step) is not None:  # a notice mid-stage (a spot reclaim)
                assert self.stopper.stop is not None
                self.record("stop", step=step, leaving=self.stopper.stop.leaving)
                self.stopper.leave(step, self.save)
            if self.restarted.agreed():
                self.save(step)
                self.record("restart", step=step, signalled=self.restarted.heard)
                self.rejoin()
            if (
                self.elastic
                and step == last_step(self.stages, stage)
                and stage + 1 < len(self.stages)
                and self.stages[stage + 1].members != world
            ):
                self.next_stage(step, stage)
            time.sleep(self.args.step_seconds)
        self.record("done", step=total)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", required=True)
    p.add_argument("--records", required=True)
    p.add_argument("--stages", default="2:8:cpu,4:8,2:8")
    p.add_argument("--gang", default=os.environ.get("SHOAL_GANG", ""))
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--eviction-wait", type=float, default=60.0)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    elastic = "TORCHELASTIC_RUN_ID" in os.environ
    if elastic:
        dist.init_process_group("gloo")
    else:  # the reference: one process that never stops
        store = os.path.join(tempfile.mkdtemp(prefix="stages-"), "store")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    model, optimizer = model_and_optimizer(args.seed)
    start = resume(args.ckpt, model, optimizer)
    bounds = Bounds(args.gang) if elastic and dist.get_rank() == 0 else None
    restarted = Restarted()
    with StopStep.from_env(eviction_wait=args.eviction_wait, last_checkpoint=start - 1) as stopper:
        job = Job(
            args,
            Stage.parse(args.stages),
            Records(args.records),
            model,
            optimizer,
            stopper,
            restarted,
            elastic,
            bounds,
        )
        job.run(start)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
