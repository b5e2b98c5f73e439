"""Every flag has an environment variable; bad values name the flag and exit 2."""

from __future__ import annotations

import pytest

from nodeagent.wiring import cli


def test_environment_fills_in_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-7")
    monkeypatch.setenv("SHOAL_PROVIDER", "gcp")
    monkeypatch.setenv("SHOAL_POLL_INTERVAL", "0.5")
    monkeypatch.setenv("SHOAL_DRY_RUN", "true")
    monkeypatch.setenv("SHOAL_KUBE_TAINTS", "")
    args = cli.parser().parse_args(["--provider", "azure"])
    assert (args.node_name, args.provider, args.poll_interval) == ("gpu-7", "azure", 0.5)
    assert args.dry_run is True
    assert args.kube_taints == frozenset()


def test_help_documents_the_environment_variables(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())  # help text is wrapped
    variables = ["NODE_NAME", "KUBECONFIG", "SHOAL_PROVIDER", "SHOAL_METADATA_URL"]
    for variable in [*variables, "SHOAL_STATE_DIR"]:
        assert f"env {variable}" in out


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--poll-interval", "0"], "--poll-interval"),
        (["--listen", "nowhere"], "--listen"),
        (["--kube-taints", "shoal.dev/revoking"], "--kube-taints"),
        (["--xid-fatal", "79,x"], "--xid-fatal"),
        (["--provider", "openstack"], "--provider"),
    ],
)
def test_bad_values_name_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.parser().parse_args(["--node-name", "n", *argv])
    assert exited.value.code == 2
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize("value", ["inf", "1e300", "604801"])
def test_seconds_beyond_a_week_are_refused(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    # These used to pass, then crash the agent at start (timedelta overflow) or make it sleep
    # for ever between metadata reads.
    with pytest.raises(SystemExit) as exited:
        cli.parser().parse_args(["--node-name", "n", "--evict-margin", value])
    assert exited.value.code == 2
    assert "--evict-margin" in capsys.readouterr().err
