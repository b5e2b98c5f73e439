"""Real torchrun launchers on loopback, one per pod, each pod's workers watching a real notice
socket: what a three-pod elastic job looks like on one machine.

The rendezvous store is hosted here (``is_host=false`` for every launcher), as it would be on a
node that is not revoked. The keep-alive is shorter than torchrun's default so that a launcher
that left is dropped from the rendezvous in about five seconds rather than fifteen; not
shorter: a heartbeat is written every one to two seconds, and on a busy machine an expiry of two
seconds dropped live launchers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from torch._C._distributed_c10d import TCPStore

from nodeagent.core.events import Pod, PodKey, PodUid
from tests.unit.nodeagent.notice_socket import Cluster, SocketAgent

ROOT = Path(__file__).resolve().parents[3]
TRAINER = ROOT / "demo" / "trainer.py"
NAMESPACE = "train"
T = TypeVar("T")


def pod_uid(name: str) -> str:
    return f"6f1c0a52-0000-4000-8000-{zlib.crc32(name.encode()):012d}"


@dataclass
class Launcher:
    pod: str
    process: subprocess.Popen[bytes]
    output: Path


@dataclass
class Job:
    """Launchers for ``pods``, the first ones on the node of ``leaving_agent``."""

    tmp: Path
    steps: int = 40
    seed: int = 7
    step_seconds: float = 0.05
    #: Each pod that leaves costs every other pod one restart.
    max_restarts: int = 3
    #: How long a leaving pod waits for its eviction before it stops its own torchrun.
    eviction_wait: float = 0.0
    launchers: list[Launcher] = field(default_factory=list)

    @property
    def log(self) -> Path:
        return self.tmp / "train.jsonl"

    @property
    def ckpt(self) -> Path:
        return self.tmp / "ckpt"

    def records(self, event: str | None = None) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line]
        return [r for r in lines if event is None or r["event"] == event]

    def trainer_args(self) -> list[str]:
        return [
            str(TRAINER),
            f"--ckpt={self.ckpt}",
            f"--records={self.log}",
            f"--steps={self.steps}",
            f"--seed={self.seed}",
            f"--step-seconds={self.step_seconds}",
            f"--eviction-wait={self.eviction_wait}",
        ]

    def launch(self, pod: str, agent: SocketAgent, port: int, nnodes: str) -> Launcher:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "POD_NAMESPACE": NAMESPACE,
            "POD_NAME": pod,
            "POD_UID": pod_uid(pod),
            "SHOAL_SOCKET": agent.socket_path,
            "OMP_NUM_THREADS": "1",
            # torchrun caches where rank 0's store server is from its first round; when the pod
            # that was rank 0 leaves, the others would wait for it forever.
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            "LOGLEVEL": os.environ.get("TORCHJOB_LOGLEVEL", "WARNING"),
        }
        rdzv = "is_host=false,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=5"
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={nnodes}",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-id=stop-step",
            f"--rdzv-conf={rdzv}",
            f"--max-restarts={self.max_restarts}",
            "--monitor-interval=0.1",
            *self.trainer_args(),
        ]
        output = self.tmp / f"{pod}.out"
        with output.open("wb") as out:
            process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        launcher = Launcher(pod, process, output)
        self.launchers.append(launcher)
        return launcher

    def reference(self) -> dict[int, float]:
        """The losses of an uninterrupted run of one process with the same seed."""
        log = self.tmp / "reference.jsonl"
        args = [*self.trainer_args()]
        args[1:3] = [f"--ckpt={self.tmp / 'reference-ckpt'}", f"--records={log}"]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        for var in ("POD_NAMESPACE", "POD_NAME", "POD_UID", "RANK", "TORCHELASTIC_RUN_ID"):
            env.pop(var, None)
        subprocess.run([sys.executable, *args], env=env, check=True, capture_output=True)
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        return {r["step"]: r["loss"] for r in lines if r["event"] == "step"}

    def outputs(self) -> str:
        return "\n".join(f"--- {lc.pod}\n{lc.output.read_text()[-3000:]}" for lc in self.launchers)

    def stop(self) -> None:
        for launcher in self.launchers:
            if launcher.process.poll() is None:
                launcher.process.terminate()
        for launcher in self.launchers:
            try:
                launcher.process.wait(30)
            except subprocess.TimeoutExpired:
                launcher.process.kill()


def rendezvous_store() -> TCPStore:
    """The c10d rendezvous store, on a free port of 127.0.0.1."""
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


class KubeletCluster(Cluster):
    """Carries out an eviction the way the kubelet does: SIGTERM to the pod's first process
    (its torchrun launcher), once the pod's launcher is known."""

    def __init__(self) -> None:
        super().__init__()
        self.launchers: dict[str, subprocess.Popen[bytes]] = {}

    def evict(self, pod: Pod, reason: str) -> bool:
        launcher = self.launchers.get(pod.key.split("/", 1)[1])
        if launcher is not None:
            launcher.terminate()
        return super().evict(pod, reason)


def agent_for(socket: Path, pods: list[str]) -> SocketAgent:
    agent = SocketAgent(socket)
    agent.cluster = KubeletCluster()
    agent.cluster.pods = [
        Pod(key=PodKey(f"{NAMESPACE}/{name}"), uid=PodUid(pod_uid(name))) for name in pods
    ]
    return agent


@contextmanager
def running(agent: SocketAgent) -> Iterator[SocketAgent]:
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()


def wait_for(check: Callable[[], T], what: str, job: Job, seconds: float = 180.0) -> T:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        if job.launchers and all(lc.process.poll() is not None for lc in job.launchers):
            break
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting until {what}\n{job.outputs()}")
