"""What the node agent's integration tests share: the agent as a real process, a worker that
watches its notices over the unix socket, pods on a fresh kwok node, and one adapter per cloud
that puts a notice into (and takes it out of) that cloud's fake metadata server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

import pytest
from packaging.requirements import Requirement
from shoal_worker import LeaveNotice, NoticeClient, NoticeRefused, PodIdentity

from contracts import names
from devcluster.ports import free_port
from fakes.clouds import CLOUDS, Alibaba, Aws, Azure, Cloud, Gcp, NoCloud
from tests import waiting

T = TypeVar("T")

KWOK_TOLERATION = {
    "key": names.KWOK_TAINT,
    "operator": "Equal",
    "value": names.KWOK_NODE_VALUE,
    "effect": "NoSchedule",
}
#: Keeps an evicted pod visible (deletion pending) so its DisruptionTarget condition can be read.
HOLD = "shoal.dev/test-hold"


def eventually(probe: Callable[[], T | None], *, timeout: float = 45, what: str = "") -> T:
    """:func:`tests.waiting.eventually`, polling every 0.1 s (notices are fast)."""
    return waiting.eventually(probe, timeout=timeout, interval=0.1, what=what)


#: What Dockerfile.agent sets for the agent beyond paths (tests/unit/test_dockerfiles.py checks).
IMAGE_ENV = {"MALLOC_ARENA_MAX": "2"}


def shipped(into: Path) -> tuple[list[str], dict[str, str]]:
    """An interpreter and environment that see the product and the distributions its wheel
    depends on, and nothing else: no dev extra (rich, matplotlib, pytest), as in the image.

    ``into`` gets one link per top-level module of those distributions; the interpreter runs
    without ``site`` (``-S -s``) on ``PYTHONPATH=into:<checkout>``.
    """
    site = Path(sysconfig.get_paths()["purelib"])
    into.mkdir(parents=True, exist_ok=True)
    for dist in _closure("shoal"):
        for top in (dist.read_text("top_level.txt") or "").split() or _tops(dist):
            for found in (site / top, *site.glob(f"{top}.*.so"), site / f"{top}.py"):
                link = into / found.name
                if found.exists() and not link.exists():
                    link.symlink_to(found)
            # A one-file module's bytecode too: compiling it again in every agent would cost
            # memory the image's agent never spends.
            cached = site / "__pycache__" / f"{top}.{sys.implementation.cache_tag}.pyc"
            if cached.exists() and not (into / "__pycache__" / cached.name).exists():
                (into / "__pycache__").mkdir(exist_ok=True)
                (into / "__pycache__" / cached.name).symlink_to(cached)
    checkout = Path(__file__).resolve().parents[3]
    env = {"PYTHONPATH": f"{into}{os.pathsep}{checkout}", **IMAGE_ENV}
    return [sys.executable, "-S", "-s"], env


def _closure(name: str) -> list[metadata.Distribution]:
    """``name``'s distribution's run-time requirements, recursively (no extras)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = [name]
    while todo:
        dist = metadata.distribution(todo.pop())
        key = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if key in seen:
            continue
        seen[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    seen.pop("shoal", None)
    return list(seen.values())


def _tops(dist: metadata.Distribution) -> list[str]:
    """Top-level names from a distribution's file list (when it ships no top_level.txt)."""
    names = {str(f).split("/", 1)[0] for f in dist.files or []}
    skip = (".dist-info", ".pth", "__pycache__")
    return sorted(n.removesuffix(".py") for n in names if not n.endswith(skip))


@dataclass
class AgentProcess:
    """``python -m nodeagent`` for one node, as a DaemonSet would run it."""

    kubeconfig: str
    node: str
    provider: str
    metadata_url: str
    workdir: Path
    extra: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    #: The interpreter and its options (``shipped()`` gives one that sees only what the image
    #: holds).
    python: list[str] = field(default_factory=lambda: [sys.executable])
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    starts: int = 0

    @property
    def socket_path(self) -> str:
        return str(self.workdir / "agent.sock")

    @property
    def log_path(self) -> Path:
        return self.workdir / f"agent-{self.starts}.log"

    def start(self, *, until_ready: bool = True) -> None:
        """Start and wait until ``/readyz`` answers 200 (or only ``/healthz``, for an agent
        started while the API server is unreachable)."""
        self.starts += 1
        self.port = free_port()
        args = [
            *self.python,
            "-m",
            "nodeagent",
            "--kubeconfig",
            self.kubeconfig,
            "--node-name",
            self.node,
            "--provider",
            self.provider,
            "--metadata-url",
            self.metadata_url,
            "--socket",
            self.socket_path,
            "--listen",
            f"127.0.0.1:{self.port}",
            "--log-format",
            "json",
            *self.extra,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
        env["SHOAL_STATE_DIR"] = str(self.workdir / "state")
        env.update(self.env)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        if until_ready:
            eventually(
                self.ready,
                timeout=waiting.STARTS_WITHIN,
                what=f"the agent to be ready ({self.log_path})",
            )
        else:
            eventually(
                self.live,
                timeout=waiting.STARTS_WITHIN,
                what=f"the agent to be live ({self.log_path})",
            )

    def get(self, path: str) -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def ready(self) -> bool:
        return self._answers("/readyz")

    def live(self) -> bool:
        return self._answers("/healthz")

    def _answers(self, path: str) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            pytest.fail(f"the agent exited with {self.proc.returncode}: {self.log_path}")
        try:
            return self.get(path)[0] == 200
        except OSError:
            return False

    def status(self) -> dict[str, Any]:
        return self.get("/status")[1]

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            return str(r.read().decode())

    def kill(self) -> None:
        """Dies at once, as on an OOM kill or a node-level crash."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for path in sorted(self.workdir.glob("agent-*.log")):
            for raw in path.read_text().splitlines():
                try:
                    lines.append(json.loads(raw))
                except json.JSONDecodeError:
                    continue
        return lines


class Worker:
    """A training worker's notice watch, on its own thread and event loop."""

    def __init__(self, pod: PodIdentity, socket_path: str) -> None:
        self.client = NoticeClient(pod, socket_path)
        self.notices: queue.Queue[LeaveNotice | Exception] = queue.Queue()
        self._loop = asyncio.new_event_loop()
        self._task: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        async def watch() -> None:
            try:
                async for notice in self.client.watch():
                    self.notices.put(notice)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.notices.put(exc)

        self._task = self._loop.create_task(watch())
        self._loop.run_forever()
        self._loop.close()

    def next(self, timeout: float = 45) -> LeaveNotice:
        try:
            item = self.notices.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"the worker heard nothing within {timeout:.0f} s")
        if isinstance(item, Exception):
            raise item
        return item

    def until(self, state: str, timeout: float = 45) -> LeaveNotice:
        deadline = time.monotonic() + timeout
        while True:
            notice = self.next(max(0.1, deadline - time.monotonic()))
            if notice.state == state:
                return notice

    def acknowledge(self, step: int) -> str:
        """From the same process and event loop as the watch, as a real worker would."""
        future = asyncio.run_coroutine_threadsafe(self.client.acknowledge(step), self._loop)
        return future.result(timeout=30)

    def close(self) -> None:
        async def finish() -> None:
            if self._task is not None:
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
            await self._loop.shutdown_asyncgens()

        asyncio.run_coroutine_threadsafe(finish(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


def worker_pod(name: str, node: str, *, worker: bool = True) -> dict[str, Any]:
    labels = {names.GANG_LABEL: "trainer"} if worker else {"app": "sidecar-service"}
    return {
        "metadata": {"name": name, "labels": labels, "finalizers": [HOLD]},
        "spec": {
            "nodeName": node,
            "tolerations": [KWOK_TOLERATION],
            "terminationGracePeriodSeconds": 30,
            "containers": [
                {
                    "name": "worker",
                    "image": "registry.example/trainer:1",
                    "resources": {"limits": {names.GPU_RESOURCE: "4"}},
                }
            ],
        },
    }


def release(core: Any, namespace: str, name: str) -> None:
    """Drop the test's finalizer so the pod (if still there) can go."""
    with contextlib.suppress(Exception):  # gone already is fine
        core.patch_namespaced_pod(
            name, namespace, [{"op": "remove", "path": "/metadata/finalizers"}]
        )


def disruption_target(pod: Any) -> Any:
    for condition in pod.status.conditions or []:
        if condition.type == "DisruptionTarget" and condition.status == "True":
            return condition
    return None


def taint(node: Any) -> Any:
    for t in node.spec.taints or []:
        if t.key == names.REVOKING_TAINT:
            return t
    return None


def events(core: Any, namespace: str, name: str, reason: str) -> list[Any]:
    found = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
    return [e for e in found.items if e.reason == reason]


__all__ = [
    "CLOUDS",
    "Alibaba",
    "Aws",
    "Azure",
    "Cloud",
    "Gcp",
    "NoCloud",
    "NoticeRefused",
    "PodIdentity",
]
