"""The real Slurm cluster does what the Slurm side of the node agent relies on: a job step spans
the three nodes with one task each, a drained node takes no new job until it is resumed, a running
batch job can be requeued and runs again, a running batch job can be shrunk off a node, and
``down`` leaves nothing behind, nor does a test session killed with its cluster up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from devcluster import process
from devcluster.process import Proc
from slurmcluster import cluster
from tests.integration.slurm.conftest import finished, job_info, lines, node_info, sbatch
from tests.waiting import STARTS_WITHIN, eventually

TASK = 'echo "$SLURM_PROCID $SLURMD_NODENAME $(hostname)"'


def test_a_step_runs_one_task_on_each_of_three_nodes(
    slurm_cluster: cluster.Cluster, tmp_path: Path
) -> None:
    done = slurm_cluster.run(
        ["srun", "--nodes=3", "--ntasks-per-node=1", f"--chdir={tmp_path}", "sh", "-c", TASK],
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rows = sorted(line.split() for line in done.stdout.splitlines())
    # Each rank on its own node, and each node is a host of its own (its own host name).
    assert rows == [["0", "sn0", "sn0"], ["1", "sn1", "sn1"], ["2", "sn2", "sn2"]]


def test_a_batch_job_launches_its_step_across_the_nodes(
    slurm_cluster: cluster.Cluster, tmp_path: Path
) -> None:
    job = sbatch(
        slurm_cluster,
        tmp_path,
        "--nodes=3",
        "--ntasks-per-node=1",
        script=f"srun sh -c '{TASK}' > {tmp_path}/step.txt\n",
    )
    info = finished(slurm_cluster, job)
    assert info["JobState"] == "COMPLETED", info
    assert info["BatchHost"] == "sn0"
    rows = sorted(line.split()[1] for line in lines(tmp_path / "step.txt"))
    assert rows == ["sn0", "sn1", "sn2"]


def test_a_drained_node_takes_no_new_job_until_resumed(
    slurm_cluster: cluster.Cluster, tmp_path: Path
) -> None:
    reason = "spot notice: leaves at 12:00:30Z"
    done = slurm_cluster.run(
        ["scontrol", "update", "nodename=sn1", "state=drain", f"reason={reason}"]
    )
    assert done.returncode == 0, done.stderr
    drained = node_info(slurm_cluster, "sn1")
    assert "DRAIN" in drained["State"].split("+"), drained
    assert drained["Reason"].startswith(reason), drained

    job = sbatch(slurm_cluster, tmp_path, "--nodelist=sn1", script="hostname\n")

    def held_for_the_node() -> dict[str, str] | None:
        info = job_info(slurm_cluster, job)
        return info if info.get("Reason", "").startswith("ReqNodeNotAvail") else None

    held = eventually(
        held_for_the_node, timeout=60, what="the job asking for the drained node held for it"
    )
    assert held["JobState"] == "PENDING", held

    done = slurm_cluster.run(["scontrol", "update", "nodename=sn1", "state=resume"])
    assert done.returncode == 0, done.stderr
    assert "DRAIN" not in node_info(slurm_cluster, "sn1")["State"].split("+")
    info = finished(slurm_cluster, job)
    assert info["JobState"] == "COMPLETED", info
    assert info["NodeList"] == "sn1"


def test_a_running_batch_job_requeued_runs_again(
    slurm_cluster: cluster.Cluster, tmp_path: Path
) -> None:
    runs = tmp_path / "runs.txt"
    job = sbatch(
        slurm_cluster,
        tmp_path,
        "--requeue",
        "--nodes=3",
        "--ntasks-per-node=1",
        script=f'echo "run ${{SLURM_RESTART_COUNT:-0}} $(hostname)" >> {runs}\nexec sleep 600\n',
    )
    eventually(lambda: lines(runs), timeout=60, what="the job's first run")

    done = slurm_cluster.run(["scontrol", "requeue", job])
    assert done.returncode == 0, done.stderr
    # It waits out its step credentials' lifetime before it may start again.
    eventually(
        lambda: len(lines(runs)) >= 2,
        timeout=cluster.CRED_EXPIRE_S + 90,
        what="the requeued job's second run",
    )
    assert [line.split()[:2] for line in lines(runs)] == [["run", "0"], ["run", "1"]]
    assert job_info(slurm_cluster, job)["Restarts"] == "1"


def test_a_running_batch_job_shrunk_off_a_node_goes_on_with_the_other_two(
    slurm_cluster: cluster.Cluster, tmp_path: Path
) -> None:
    first, done, second = tmp_path / "first.txt", tmp_path / "done.txt", tmp_path / "second.txt"
    # A step across the three nodes whose tasks wait for the word to finish, then a step on two.
    job = sbatch(
        slurm_cluster,
        tmp_path,
        "--nodes=3",
        "--ntasks-per-node=1",
        script=(
            f"srun sh -c 'echo $SLURMD_NODENAME >> {first}; "
            f"while [ ! -e {tmp_path}/go ]; do sleep 0.1; done; echo $SLURMD_NODENAME >> {done}'\n"
            f"srun --nodes=2 --ntasks=2 sh -c 'echo $SLURMD_NODENAME' > {second}\n"
        ),
    )
    eventually(lambda: len(lines(first)) == 3, timeout=60, what="the step on all three nodes")

    shrunk = slurm_cluster.run(["scontrol", "update", f"jobid={job}", "numnodes=2"], cwd=tmp_path)
    assert shrunk.returncode == 0, shrunk.stderr
    info = job_info(slurm_cluster, job)
    assert info["NumNodes"] == "2", info
    assert info["JobState"] == "RUNNING", info
    kept = expand(slurm_cluster, info["NodeList"])
    assert len(kept) == 2
    released = next(n.name for n in slurm_cluster.nodes if n.name not in kept)
    # The task on the released node is killed (srun says so in the job's output).
    output = tmp_path / f"job-{job}.out"
    eventually(
        lambda: f"{released}: task" in output.read_text() if output.exists() else False,
        timeout=60,
        what=f"srun to report its task on {released} killed",
    )
    (tmp_path / "go").touch()

    # The two other tasks finished their step, and the job's next step ran on the two nodes it
    # kept.
    assert finished(slurm_cluster, job)["JobState"] == "COMPLETED"
    assert sorted(lines(done)) == kept
    assert sorted(lines(second)) == kept
    # The released node takes another job.
    other = sbatch(slurm_cluster, tmp_path, f"--nodelist={released}", script="hostname\n")
    assert finished(slurm_cluster, other)["JobState"] == "COMPLETED"


def test_down_leaves_no_process_namespace_or_interface(
    slurm_cluster: cluster.Cluster, tmp_path: Path
) -> None:
    """A second cluster of one node, with a job left running, stopped with ``down``."""
    run_dir = tmp_path / "second"
    second = cluster.up(run_dir, nodes=1, die_with_parent=True)
    try:
        job = sbatch(second, tmp_path, script=f"echo up > {tmp_path}/up.txt\nexec sleep 600\n")
        eventually(
            lambda: lines(tmp_path / "up.txt"), timeout=STARTS_WITHIN, what="the job to start"
        )
        in_node = {pid: started_at(pid) for pid in cluster.in_netns(second.nodes[0].netns)}
        assert len(in_node) >= 3, in_node  # slurmd, slurmstepd and the job at least
        assert job_info(second, job)["JobState"] == "RUNNING"
    finally:
        left = cluster.down(run_dir)
    assert left == []
    assert all(not os.path.lexists(f"/run/netns/{ns}") for ns in second.netns)
    assert [pid for pid, ticks in in_node.items() if started_at(pid) == ticks] == []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    assert second.tag not in links.stdout
    assert not Path(second.socket_dir).exists()
    assert not (run_dir / cluster.STATE).exists()
    assert not (cluster.REGISTRY / f"{second.tag}.json").exists()


#: A test session in a process of its own: starts a one-node cluster, says so, and waits.
SESSION = """
import sys, time
from pathlib import Path
from slurmcluster import cluster
cluster.up(Path(sys.argv[1]), nodes=1, die_with_parent=True)
print("up", flush=True)
time.sleep(600)
"""


@pytest.mark.reliability
def test_a_cluster_whose_session_was_killed_is_removed_by_the_next_up(
    slurm_cluster: cluster.Cluster, tmp_path: Path
) -> None:
    killed_dir = tmp_path / "killed"
    with subprocess.Popen(
        [sys.executable, "-c", SESSION, str(killed_dir)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(cluster.__file__).parents[1],
    ) as session:
        try:
            assert session.stdout is not None
            said = []
            for line in session.stdout:  # until it says it is up, or exits
                said.append(line.strip())
                if said[-1] == "up":
                    break
            assert said[-1:] == ["up"], said
            killed = cluster.Cluster.load(killed_dir)
            job = sbatch(killed, tmp_path, script=f"echo up > {tmp_path}/up.txt\nexec sleep 600\n")
            eventually(
                lambda: lines(tmp_path / "up.txt"), timeout=STARTS_WITHIN, what="the job to start"
            )
            assert job
        finally:
            session.send_signal(signal.SIGKILL)
    # The daemons die with their session (their death signal); the job and its slurmstepd, and
    # the namespaces, would stay.
    daemons = [Proc.from_json(p) for p in json_state(killed_dir)["procs"]]
    eventually(
        lambda: not any(process.alive(p) for p in daemons),
        timeout=30,
        what="the killed session's daemons to die with it",
    )
    left = {pid: started_at(pid) for pid in cluster.in_netns(killed.nodes[0].netns)}
    assert left, "nothing outlived the killed session: the test shows nothing"

    next_dir = tmp_path / "next"
    cluster.up(next_dir, nodes=1, die_with_parent=True)
    assert cluster.down(next_dir) == []
    assert all(not os.path.lexists(f"/run/netns/{ns}") for ns in killed.netns)
    assert [pid for pid, ticks in left.items() if started_at(pid) == ticks] == []
    assert not (cluster.REGISTRY / f"{killed.tag}.json").exists()
    assert not Path(killed.socket_dir).exists()


def json_state(run_dir: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((run_dir / cluster.STATE).read_text())
    return loaded


def expand(slurm: cluster.Cluster, nodelist: str) -> list[str]:
    done = slurm.run(["scontrol", "show", "hostnames", nodelist])
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def started_at(pid: int) -> int | None:
    """The process's start time in clock ticks, None when it has exited (a zombie waiting for
    the machine's init to collect it has exited): a pid with another start time is another
    process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])
