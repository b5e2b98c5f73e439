"""A worker on a Slurm node names its job step from what Slurm put in its environment; a pod's
identity, when there is one, is used as before."""

from __future__ import annotations

import pytest
from shoal_worker import NoticeClient, NoticeRefused, PodIdentity, SlurmStep, cli
from shoal_worker.watcher import identity_from_env, identity_message

POD = {"POD_NAMESPACE": "train", "POD_NAME": "worker-0", "POD_UID": "6f1c0a52"}
STEP = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "gpu-1"}
ALL = (*POD, *STEP, "SLURM_STEPID", "SHOAL_SOCKET")


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ALL:
        monkeypatch.delenv(var, raising=False)


def setenv(monkeypatch: pytest.MonkeyPatch, values: dict[str, str]) -> None:
    for var, value in values.items():
        monkeypatch.setenv(var, value)


def test_a_job_step_names_itself_by_its_slurm_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(monkeypatch, STEP)
    assert identity_from_env() == SlurmStep("42", "0", "gpu-1")
    assert NoticeClient.from_env().pod == SlurmStep("42", "0", "gpu-1")
    message = identity_message(SlurmStep("42", "0", "gpu-1"))
    assert (message.namespace, message.name, message.uid) == ("", "", "")
    assert (message.slurm.job_id, message.slurm.step_id, message.slurm.node) == ("42", "0", "gpu-1")


def test_the_batch_script_is_the_batch_step(monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(monkeypatch, {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "gpu-1"})
    assert identity_from_env() == SlurmStep("42", "batch", "gpu-1")


def test_a_pod_identity_wins_over_slurm_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(monkeypatch, {**STEP, **POD})
    assert identity_from_env() == PodIdentity("train", "worker-0", "6f1c0a52")
    message = identity_message(PodIdentity("train", "worker-0", "6f1c0a52"))
    assert not message.HasField("slurm")


def test_without_either_identity_the_pod_variables_are_asked_for_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(NoticeRefused, match="POD_NAMESPACE is not set"):
        identity_from_env()
    setenv(monkeypatch, {"SLURM_JOB_ID": "42"})
    with pytest.raises(NoticeRefused, match="SLURMD_NODENAME is not set"):
        identity_from_env()


def test_the_cli_in_a_job_step_needs_no_pod_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    setenv(monkeypatch, {**STEP, "SHOAL_SOCKET": f"{tmp_path}/absent.sock"})
    # It names its step and reaches for the agent (absent here): exit 4, not a usage error.
    assert cli.main(["ack", "5"]) == cli.EXIT_AGENT_GONE
    assert "agent unreachable" in capsys.readouterr().err
