"""A tiny data-parallel training job for torchrun, deterministic on CPU.

Every step trains on one global batch of ``MICRO`` micro-batches drawn from a generator seeded
by (seed, step); each rank takes an equal share of them, and the per-micro-batch gradients are
gathered and summed in micro-batch order on every rank. The result is bit-identical for any
world size that divides ``MICRO``: a run that lost a pod and resumed from its checkpoint can be
compared float for float with one that never stopped.

Each rank appends JSON lines to ``--records``: ``start`` (world size, first step), ``step`` (the
global batch's loss), ``stop`` (the agreed stop step of a notice), ``restart`` (the step saved
when torchrun stopped the workers) and ``done``; each names the rank, the pod (``POD_NAME``) or
the Slurm node (``SLURMD_NODENAME``), and the time. Without torchrun it runs as a world of one
(the uninterrupted reference).

torchrun also stops the workers itself, with SIGTERM, when a pod joins the job (a membership
change: the job grows) or when its own launcher is stopped. Such a stop loses nothing either:
the signal only raises a flag, and once per step the ranks agree (one all-reduce, as for a
notice) to save the step they just trained and exit, and the new round resumes after it.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
from shoal_worker.distributed import EXIT_REJOIN, StopStep, resume, save_checkpoint
from torch import nn

MICRO = 6  # divisible by every world size the tests use (1, 2, 3)
BATCH = 4
WIDTH = 8


def record(path: str, event: str, **fields: Any) -> None:
    line = {
        "event": event,
        "t": time.time(),
        "rank": dist.get_rank(),
        "pod": os.environ.get("POD_NAME", ""),
        "node": os.environ.get("SLURMD_NODENAME", ""),  # a Slurm job step's node
        **fields,
    }
    with open(path, "a") as out:
        out.write(json.dumps(line) + "\n")


def model_and_optimizer(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(WIDTH, 16), nn.Tanh(), nn.Linear(16, 1))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, seed: int, step: int) -> float:
    world, rank = dist.get_world_size(), dist.get_rank()
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(MICRO, BATCH, WIDTH, generator=generator)
    y = torch.sin(x.sum(-1, keepdim=True))
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
    every = torch.cat(gathered)  # in micro-batch order
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


class Stopped:
    """Whether torchrun (or anyone) sent this rank SIGTERM."""

    def __init__(self) -> None:
        self.heard = False
        signal.signal(signal.SIGTERM, self._heard)

    def _heard(self, signum: int, frame: object) -> None:
        self.heard = True

    def agreed(self) -> bool:
        """Whether any rank heard SIGTERM (collective: every rank calls it once per step)."""
        flag = torch.tensor([int(self.heard)], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", required=True)
    p.add_argument("--records", required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--eviction-wait", type=float, default=0.0)
    args = p.parse_args()
    faulthandler.register(signal.SIGUSR1)  # where a stuck rank is: kill -USR1 PID
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    else:
        store = os.path.join(tempfile.mkdtemp(prefix="trainer-"), "store")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    stopped = Stopped()
    model, optimizer = model_and_optimizer(args.seed)
    start = resume(args.ckpt, model, optimizer)
    record(args.records, "start", step=start, world=dist.get_world_size())
    # The test's agent records evictions without a kubelet to carry them out: no waiting.
    stopper = StopStep.from_env(eviction_wait=args.eviction_wait, last_checkpoint=start - 1)
    with stopper:
        for step in range(start, args.steps):
            loss = train_step(model, optimizer, args.seed, step)
            record(args.records, "step", step=step, loss=loss, world=dist.get_world_size())
            stop = stopper.check(step)
            if stop is not None:
                assert stopper.stop is not None
                record(args.records, "stop", step=stop, leaving=stopper.stop.leaving)
                stopper.leave(stop, lambda s: save_checkpoint(args.ckpt, s, model, optimizer))
            if stopped.agreed():
                save_checkpoint(args.ckpt, step, model, optimizer)
                record(args.records, "restart", step=step, signalled=stopped.heard)
                dist.barrier()
                dist.destroy_process_group()
                # A rank whose launcher is not stopping it asks for a new round (see
                # shoal_worker.distributed.EXIT_REJOIN); torchrun ignores the others' status.
                sys.exit(EXIT_REJOIN)
            time.sleep(args.step_seconds)
    record(args.records, "done", step=args.steps)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
