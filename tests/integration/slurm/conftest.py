"""A real Slurm cluster for the tests of this folder: Debian's slurmctld and three slurmd nodes,
each in a network namespace of its own (``slurmcluster/``; docs/slurm.md, "The test cluster").

Fixtures:

``slurm_cluster`` (per test; the cluster is started once for the folder) — a
:class:`slurmcluster.cluster.Cluster`:

- ``nodes``: the three :class:`slurmcluster.cluster.Node` hosts ``sn0``, ``sn1``, ``sn2``
  (``node("sn1")`` by name), each with ``name``, ``ip`` (its address on the cluster's bridge),
  ``netns`` (its ``ip netns`` name), ``folder`` (a folder of its own in the run folder),
  ``spool`` (its ``SlurmdSpoolDir``, under ``/run``) and ``log`` (its slurmd log);
- ``node.exec(argv, timeout=60, cwd=None, env=None, input=None)``: run a command *on* that node —
  in its network namespace, with its host name (``hostname`` says ``sn1``), ``SLURM_CONF`` set —
  and wait; a ``subprocess.CompletedProcess[str]``, never raising on a non-zero exit.
  ``node.command(argv)`` is the same command line for ``subprocess.Popen`` (a program that
  keeps running on the node, such as an agent);
- ``conf``: the ``slurm.conf`` path (``SLURM_CONF``); ``env()``: this process's environment with
  it set; ``run(argv, timeout=60, cwd=None, input=None)``: a client (``scontrol``, ``sbatch``,
  ``srun``, ``squeue``...) run on the host, which reaches every node over the bridge;
- ``work_dir``: the default working folder of ``run`` and ``exec`` (give jobs ``--chdir`` and
  ``--output`` in a test's own ``tmp_path``).

Jobs run as root; job step credentials live ``cluster.CRED_EXPIRE_S`` s, which is also how long a
requeued batch job waits before it starts again. After each test every job is cancelled, every
node resumed, and the fixture waits until all nodes are idle again, so a test may drain nodes and
leave jobs behind.

The node agent on a node (``--platform slurm``, as a service next to slurmd would run):
:func:`agents_on` starts one per named node, each reading its own fake cloud's metadata server
through a forwarder on the host's bridge address (:func:`forward`: the servers listen on the
host's loopback, which a node's namespace cannot reach), and yields each node's
:class:`SlurmAgent` (``socket_path``, ``log_path``, ``log_events()``, ``watching()``).

Skipped, saying why, where the machine cannot start Slurm (not root, no ``ip``, Slurm not
installed: ``make slurm``). The folder runs on one xdist worker (``tests/conftest.py``
``ONE_WORKER_FOLDERS``), and test sessions on one machine take turns running a cluster
(``cluster.one_at_a_time``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from fakes import metadata
from fakes.clouds import Cloud
from slurmcluster import cluster, install
from tests.waiting import STARTS_WITHIN, add_machine_wait, eventually

#: The checkout: jobs and agents import the project from it (``PYTHONPATH``).
CHECKOUT = Path(__file__).resolve().parents[3]

#: The states a job ends in.
FINAL = frozenset(
    ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
     "DEADLINE", "PREEMPTED")
)  # fmt: skip
_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z:/]*)=")


def skip_reason() -> str | None:
    reason = install.unavailable()
    return f"this machine cannot start Slurm: {reason}" if reason else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The folder's cluster first waits for the machine's Slurm slot, up to
    :data:`cluster.SLOT_WAIT`, while another run's cluster holds it."""
    add_machine_wait(config, items, Path(__file__).parent, cluster.SLOT_WAIT)


@pytest.fixture(scope="package")
def slurm_cluster_once(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.Cluster]:
    """One cluster for the folder (torn down after its last test); ``down`` must leave nothing."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    run_dir = tmp_path_factory.mktemp("slurm")
    with cluster.one_at_a_time():
        started = cluster.up(run_dir, nodes=3, die_with_parent=True)
        try:
            yield started
        finally:
            left = cluster.down(run_dir)
            if os.environ.get("SHOAL_KEEP_LOGS"):
                print(f"Slurm logs kept in {run_dir / 'logs'}")
    assert not left, f"the Slurm cluster's down left {left}"


@pytest.fixture
def slurm_cluster(slurm_cluster_once: cluster.Cluster) -> Iterator[cluster.Cluster]:
    """The folder's cluster, all nodes idle; afterwards every job cancelled, every node resumed."""
    yield slurm_cluster_once
    reset(slurm_cluster_once)


def reset(slurm: cluster.Cluster) -> None:
    slurm.run(["scancel", "--user=root"])
    for node in slurm.nodes:
        state = node_info(slurm, node.name).get("State", "")
        if "DRAIN" in state or "DOWN" in state:
            slurm.run(["scontrol", "update", f"nodename={node.name}", "state=resume"])
    names = {n.name for n in slurm.nodes}

    def idle() -> bool:
        states = cluster.node_states(slurm)
        return set(states) == names and all(s == "idle" for s in states.values())

    eventually(idle, timeout=120, what="every Slurm node idle again after the test")


def fields(line: str) -> dict[str, str]:
    """``Key=Value ...`` of ``scontrol show -o`` as a dict (a value may hold spaces)."""
    marks = list(_FIELD.finditer(line))
    found = {}
    for here, after in zip(marks, [*marks[1:], None], strict=True):
        end = after.start() if after else len(line)
        found[here.group(1)] = line[here.end() : end].strip()
    return found


def job_info(slurm: cluster.Cluster, job: str) -> dict[str, str]:
    done = slurm.run(["scontrol", "show", "job", "--oneliner", job])
    return fields(done.stdout.strip()) if done.returncode == 0 else {}


def node_info(slurm: cluster.Cluster, node: str) -> dict[str, str]:
    done = slurm.run(["scontrol", "show", "node", "--oneliner", node])
    return fields(done.stdout.strip()) if done.returncode == 0 else {}


def sbatch(slurm: cluster.Cluster, folder: Path, *args: str, script: str) -> str:
    """Submit ``script`` (a shell script body) as a batch job run in ``folder``; its job id."""
    done = slurm.run(
        ["sbatch", "--parsable", f"--chdir={folder}", f"--output={folder}/job-%j.out", *args],
        input="#!/bin/sh\n" + script,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def finished(slurm: cluster.Cluster, job: str, *, timeout: float = 120) -> dict[str, str]:
    """The job's fields once it has ended (a final state)."""

    def ended() -> dict[str, str] | None:
        info = job_info(slurm, job)
        return info if info.get("JobState") in FINAL else None

    return eventually(ended, timeout=timeout, what=f"Slurm job {job} to end")


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# --------------------------------------------------------------------------------------------
# The node agent on a node of the cluster


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


async def forward(host: str, target_port: int) -> asyncio.Server:
    """Accept on ``host`` (a free port) and carry each connection to 127.0.0.1:``target_port``."""

    async def carry(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        inner_reader, inner_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(
            _pipe(reader, inner_writer), _pipe(inner_reader, writer), return_exceptions=True
        )

    return await asyncio.start_server(carry, host, 0)


class SlurmAgent:
    """``python -m nodeagent --platform slurm`` on one node of the cluster; its socket, state
    and log in ``workdir``."""

    def __init__(
        self, node: cluster.Node, metadata_url: str, workdir: Path, extra: Sequence[str] = ()
    ) -> None:
        self.node = node
        self.extra = list(extra)
        self.metadata_url = metadata_url
        self.workdir = workdir
        self.socket_path = str(workdir / "agent.sock")
        self.log_path = workdir / "agent.log"
        self.port = 9102
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start the agent (:meth:`wait_ready` waits until it serves)."""
        argv = [
            sys.executable,
            "-m",
            "nodeagent",
            "--platform",
            "slurm",
            "--node-name",
            self.node.name,
            "--provider",
            "aws",
            "--metadata-url",
            self.metadata_url,
            "--socket",
            self.socket_path,
            "--state-dir",
            str(self.workdir / "state"),
            "--listen",
            f"{self.node.ip}:{self.port}",
            "--gpu",
            "off",
            "--log-format",
            "json",
            *self.extra,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
        env["PYTHONPATH"] = str(CHECKOUT)
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.node.command(argv), stdout=log, stderr=subprocess.STDOUT, env=env
            )

    def wait_ready(self) -> None:
        eventually(
            self.ready,
            timeout=STARTS_WITHIN,
            what=f"the agent on {self.node.name} ready ({self.log_path})",
        )

    def ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            pytest.fail(f"the agent exited with {self.proc.returncode}: {self.log_path}")
        url = f"http://{self.node.ip}:{self.port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)

    def log_events(self) -> list[dict[str, Any]]:
        found = []
        for raw in self.log_path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                found.append(json.loads(raw))
        return found

    def logged(self, event: str) -> list[dict[str, Any]]:
        """The agent's log lines of ``event`` so far."""
        return [e for e in self.log_events() if e.get("event") == event]

    def watching(self, job: str | None = None) -> bool:
        """A job step on the node (of ``job``, when named) watches the notice socket: the agent
        admitted it."""
        said = self.logged("worker_watching")
        return any(job is None or e.get("pod") == f"slurm/{job}" for e in said)


@contextlib.contextmanager
def agents_on(
    slurm: cluster.Cluster,
    clouds: Mapping[str, Cloud],
    servers: metadata.Threaded,
    root: Path,
    extra: Sequence[str] = (),
) -> Iterator[dict[str, SlurmAgent]]:
    """An agent on each node named in ``clouds`` (its workdir ``root/<node>``), reading that
    node's cloud; all started, then all waited for; stopped afterwards."""
    forwarders: list[asyncio.Server] = []
    running: dict[str, SlurmAgent] = {}
    try:
        for name, cloud in clouds.items():
            port = urlsplit(cloud.url).port
            assert port is not None
            forwarder = servers.run(forward(slurm.host_ip, port))
            forwarders.append(forwarder)
            bound = forwarder.sockets[0].getsockname()[1]
            url = f"http://{slurm.host_ip}:{bound}"
            running[name] = SlurmAgent(slurm.node(name), url, root / name, extra)
            running[name].launch()
        for agent in running.values():
            agent.wait_ready()
        yield running
    finally:
        for agent in running.values():
            agent.stop()
        for forwarder in forwarders:
            servers.call(forwarder.close)
        if os.environ.get("SHOAL_KEEP_LOGS"):
            print("agent logs: " + " ".join(str(a.log_path) for a in running.values()))
