"""The node agent on a real slurmd node (``--platform slurm``, no Kubernetes API): a job step's
worker watches the notice socket with ``python -m shoal_worker wait``, a spot notice from the AWS
metadata stand-in (the one the agent's Kubernetes tests use) drains the node with the agent's
reason and tells the worker, the worker's acknowledgement has the job requeued, and the notice
withdrawn resumes the node, where the requeued job runs again.

The agent runs on node ``sn1`` as a service next to slurmd would: in the node's network
namespace, with its host name and ``SLURM_CONF`` (``Node.command``). The metadata server listens
on the host's loopback, so a small forwarder on the host's bridge address carries the agent's
reads to it, as a node's link-local route would."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakes import metadata
from fakes.clouds import Aws
from slurmcluster import cluster
from tests.integration.slurm.conftest import (
    CHECKOUT,
    SlurmAgent,
    agents_on,
    job_info,
    lines,
    node_info,
    sbatch,
)
from tests.waiting import STARTS_WITHIN, eventually

NODE = "sn1"


@pytest.fixture
def aws() -> Iterator[tuple[Aws, metadata.Threaded]]:
    servers = metadata.Threaded()
    yield Aws(servers), servers
    servers.close()


@pytest.fixture
def agent(
    request: pytest.FixtureRequest,
    slurm_cluster: cluster.Cluster,
    aws: tuple[Aws, metadata.Threaded],
    tmp_path: Path,
) -> Iterator[SlurmAgent]:
    """The agent on ``sn1``; more flags as the test's parameter (``indirect``)."""
    cloud, servers = aws
    extra = list(getattr(request, "param", []))
    with agents_on(slurm_cluster, {NODE: cloud}, servers, tmp_path, extra) as running:
        yield running[NODE]


WORKER = """\
echo "run ${{SLURM_RESTART_COUNT:-0}} $(hostname)" >> {folder}/runs.txt
if [ "${{SLURM_RESTART_COUNT:-0}}" = 0 ]; then
  srun --ntasks=1 sh -c '{python} -m shoal_worker wait > {folder}/notice.json && \
{python} -m shoal_worker ack 7 > {folder}/ack.txt 2>&1'
fi
exec sleep 600
"""


def test_a_spot_notice_drains_the_node_tells_the_step_and_its_ack_requeues_the_job(
    slurm_cluster: cluster.Cluster,
    agent: SlurmAgent,
    aws: tuple[Aws, metadata.Threaded],
    tmp_path: Path,
) -> None:
    cloud, _ = aws
    folder = tmp_path / "job"
    folder.mkdir()
    script = WORKER.format(folder=folder, python=sys.executable)
    job = sbatch(
        slurm_cluster,
        folder,
        "--requeue",
        f"--nodelist={NODE}",
        f"--export=ALL,SHOAL_SOCKET={agent.socket_path},PYTHONPATH={CHECKOUT}",
        script=script,
    )
    eventually(lambda: lines(folder / "runs.txt"), timeout=STARTS_WITHIN, what="the job to start")

    # The worker watches before the notice: the agent knows its step (and has admitted it).
    def watching() -> bool:
        return any(e.get("event") == "worker_watching" for e in agent.log_events())

    eventually(watching, timeout=60, what=f"the job step watching the socket ({agent.log_path})")

    cloud.post()

    def drained() -> dict[str, str] | None:
        info = node_info(slurm_cluster, NODE)
        return info if "DRAIN" in info.get("State", "") else None

    info = eventually(drained, timeout=60, what=f"{NODE} drained by the agent")
    assert info["Reason"].startswith(f"shoal: aws terminate until {cloud.time}"), info
    told = json.loads(eventually(lambda: lines(folder / "notice.json"), timeout=30)[0])
    assert (told["source"], told["kind"]) == ("aws", "terminate")

    # The worker acknowledges at once; the agent requeues the job.
    assert eventually(lambda: lines(folder / "ack.txt"), timeout=30) == ["accepted"]

    # Requeued (a restart counted), and the job's AdminComment says by whom and why.
    def requeued() -> dict[str, str] | None:
        found = job_info(slurm_cluster, job)
        said = found.get("AdminComment", "").startswith(f"shoal: requeued off {NODE}: aws")
        return found if found.get("Restarts") == "1" and said else None

    eventually(requeued, timeout=60, what=f"job {job} requeued ({agent.log_path})")
    events = [e.get("event") for e in agent.log_events()]
    assert {"slurm_node_drained", "slurm_job_told", "slurm_job_requeued"} <= set(events)

    # Withdrawn: the node takes jobs again, and the requeued job runs there.
    cloud.withdraw()

    def resumed() -> dict[str, str] | None:
        info = node_info(slurm_cluster, NODE)
        return info if "DRAIN" not in info.get("State", "DRAIN") else None

    eventually(resumed, timeout=60, what=f"{NODE} resumed after the withdrawal")
    eventually(
        lambda: len(lines(folder / "runs.txt")) >= 2,
        timeout=cluster.CRED_EXPIRE_S + 90,
        what="the requeued job running again",
    )
    assert [line.split() for line in lines(folder / "runs.txt")] == [
        ["run", "0", NODE],
        ["run", "1", NODE],
    ]


def test_a_process_outside_the_job_step_it_names_is_refused(
    slurm_cluster: cluster.Cluster, agent: SlurmAgent
) -> None:
    """A process on the node that is in no job step names one: Slurm does not list it."""
    env = {
        "SLURM_JOB_ID": "999999",
        "SLURM_STEP_ID": "0",
        "SLURMD_NODENAME": NODE,
        "SHOAL_SOCKET": agent.socket_path,
        "PYTHONPATH": str(CHECKOUT),
    }
    done = slurm_cluster.node(NODE).exec(
        [sys.executable, "-m", "shoal_worker", "ack", "1"], env=env
    )
    assert done.returncode == 3, (done.stdout, done.stderr)  # refused, not unreachable
    assert "not in job step 999999.0" in done.stderr


SPANNING = """\
srun --nodes=3 --ntasks-per-node=1 sh -c 'echo $SLURMD_NODENAME >> {folder}/started.txt
if [ "$SLURMD_NODENAME" = {node} ]; then
  {python} -m shoal_worker wait > {folder}/notice.json &&
  {python} -m shoal_worker ack 7 > {folder}/ack.txt 2>&1
fi
exec sleep 600'
"""


@pytest.mark.parametrize("agent", [["--slurm-on-notice", "shrink"]], indirect=True)
def test_shrink_takes_the_leaving_node_out_of_a_job_that_runs_on_elsewhere(
    slurm_cluster: cluster.Cluster,
    agent: SlurmAgent,
    aws: tuple[Aws, metadata.Threaded],
    tmp_path: Path,
) -> None:
    cloud, _ = aws
    folder = tmp_path / "job"
    folder.mkdir()
    job = sbatch(
        slurm_cluster,
        folder,
        "--nodes=3",
        "--ntasks-per-node=1",
        f"--export=ALL,SHOAL_SOCKET={agent.socket_path},PYTHONPATH={CHECKOUT}",
        script=SPANNING.format(folder=folder, node=NODE, python=sys.executable),
    )
    eventually(
        lambda: len(lines(folder / "started.txt")) == 3, timeout=60, what="the step on 3 nodes"
    )

    def watching() -> bool:
        return any(e.get("event") == "worker_watching" for e in agent.log_events())

    eventually(watching, timeout=60, what=f"the step on {NODE} watching ({agent.log_path})")
    cloud.post()
    assert eventually(lambda: lines(folder / "ack.txt"), timeout=60) == ["accepted"]

    def shrunk() -> dict[str, str] | None:
        found = job_info(slurm_cluster, job)
        said = found.get("AdminComment", "").startswith(f"shoal: shrunk off {NODE}: aws")
        return found if found.get("NumNodes") == "2" and said else None

    info = eventually(shrunk, timeout=60, what=f"job {job} shrunk off {NODE} ({agent.log_path})")
    assert info["JobState"] == "RUNNING", info
    assert info.get("Restarts", "0") == "0", info
    kept = slurm_cluster.run(["scontrol", "show", "hostnames", info["NodeList"]]).stdout.split()
    assert sorted(kept) == ["sn0", "sn2"], info
    assert node_info(slurm_cluster, NODE)["Reason"].startswith("shoal: aws terminate until")
