"""Who may call the notice socket as a Slurm job step: the agent asks Slurm (the exact command
on this node), never the caller."""

from __future__ import annotations

import pytest

from nodeagent.adapters.slurm import SlurmCallers
from tests.unit.nodeagent.slurm.fake_slurm import FakeSlurm, Job

pytestmark = pytest.mark.reliability


@pytest.fixture
def slurm() -> FakeSlurm:
    return FakeSlurm(
        jobs={
            "42": Job(steps={"batch": [101], "0": [102, 103]}, nodes=["gpu-1"]),
            "9": Job(steps={"0": [301]}, nodes=["gpu-0"]),
        }
    )


async def test_a_process_of_the_step_it_names_is_admitted_as_its_job(slurm: FakeSlurm) -> None:
    callers = SlurmCallers("gpu-1", runner=slurm)
    assert await callers.admit("42", "0", "gpu-1", 103) == ("slurm/42", "slurm:42")
    assert await callers.admit("42", "batch", "gpu-1", 101) == ("slurm/42", "slurm:42")
    assert slurm.calls == [
        ("scontrol", "listpids", "42", "gpu-1"),
        ("scontrol", "listpids", "42", "gpu-1"),
    ]


async def test_a_process_naming_a_step_it_is_not_in_is_refused(slurm: FakeSlurm) -> None:
    callers = SlurmCallers("gpu-1", runner=slurm)
    # Another step of the same job, a process outside Slurm, a job of another node.
    assert await callers.admit("42", "0", "gpu-1", 101) == (
        "process 101 is not in job step 42.0 on gpu-1"
    )
    assert "not in job step 42.0" in str(await callers.admit("42", "0", "gpu-1", 4242))
    assert "not in job step 9.0" in str(await callers.admit("9", "0", "gpu-1", 301))


async def test_a_step_of_another_node_or_a_malformed_id_is_refused_without_asking_slurm(
    slurm: FakeSlurm,
) -> None:
    callers = SlurmCallers("gpu-1", runner=slurm)
    assert "names node 'gpu-0'" in str(await callers.admit("9", "0", "gpu-0", 301))
    for job, step in (("42;reboot", "0"), ("", "0"), ("42", "0 --help"), ("42", "")):
        assert "name the job step" in str(await callers.admit(job, step, "gpu-1", 102))
    assert slurm.calls == []
