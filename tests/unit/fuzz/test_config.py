"""Configuration is user input too: a scheduler config file and the agent's flags (and their
environment variables) are either taken, with every value in its documented range, or refused
with a message naming the option. Never a traceback at start-up."""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from nodeagent.wiring import cli
from scheduler.settings import OPTIONS, SettingsError, resolve
from tests.unit.fuzz.cases import Cases, search

pytestmark = pytest.mark.reliability

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(),
    st.text(max_size=15),
    st.sampled_from([".inf", "-.inf", ".nan", "1e400", "0x10", "~", "yes", "-1", "65536"]),
)
KEYS = st.sampled_from([o.name for o in OPTIONS] + [o.attr for o in OPTIONS] + ["bogus"])


def test_scheduler_config_file(tmp_path: Path) -> None:
    cases = Cases("scheduler config file")
    conf = tmp_path / "scheduler.yaml"

    @search(800)
    @given(
        st.one_of(
            st.dictionaries(KEYS, SCALARS | st.lists(SCALARS, max_size=3), max_size=4).map(
                lambda d: yaml.safe_dump(d, allow_unicode=True)
            ),
            st.dictionaries(KEYS, st.text(max_size=15), max_size=4).map(
                lambda d: "".join(f"{k}: {v}\n" for k, v in d.items())
            ),
            st.text(max_size=80),
        )
    )
    def run(text: str) -> None:
        cases()
        conf.write_text(text)
        settings = None
        try:
            settings = resolve(["--config", str(conf)], {})
        except SettingsError as exc:
            refused = str(exc)
        else:
            refused = ""
        if refused:
            assert str(conf) in refused  # names the file (and the option, when there is one)
            return
        assert settings is not None
        assert 1 <= settings.bind_workers <= 1024
        assert settings.burst >= 1
        assert 0 <= settings.http_port <= 65535
        assert math.isfinite(settings.qps)
        assert settings.max_backoff >= 0
        assert settings.reclaim_grace >= 0
        assert isinstance(settings.reclaim, bool)

    run()
    cases.record()


AGENT_FLAGS = [
    "--listen",
    "--poll-interval",
    "--metadata-timeout",
    "--evict-margin",
    "--delete-margin",
    "--drain-lead",
    "--xid-fatal",
    "--kube-taints",
    "--kube-taint-lead",
    "--kube-pod-conditions",
    "--kube-pod-lead",
    "--gpu-fault-lead",
    "--provider",
    "--gpu",
]
SECONDS = {
    "poll_interval",
    "metadata_timeout",
    "evict_margin",
    "delete_margin",
    "drain_lead",
    "kube_taint_lead",
    "kube_pod_lead",
    "gpu_fault_lead",
}


def test_agent_flags() -> None:
    cases = Cases("agent CLI flags")

    @search(800)
    @given(
        st.sampled_from(AGENT_FLAGS),
        st.one_of(
            st.text(max_size=20),
            st.floats().map(repr),
            st.integers().map(str),
            st.sampled_from(["inf", "nan", "1e300", ":", "host:99999", "a=b:c", "x,,y"]),
        ),
    )
    def run(flag: str, value: str) -> None:
        cases()
        err = io.StringIO()
        args = None
        code: object = None
        try:
            with contextlib.redirect_stderr(err):
                args = cli.parser().parse_args(["--node-name", "n", f"{flag}={value}"])
        except SystemExit as exited:
            code = exited.code
        if args is None:
            assert code == 2
            assert flag in err.getvalue()
            return
        for name in SECONDS:
            assert 0 < getattr(args, name) <= cli.MAX_SECONDS
        _host, port = args.listen
        assert 0 <= port <= 65535

    run()
    cases.record()
