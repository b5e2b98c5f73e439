"""Neither program leaks a credential or more than it must: a kubeconfig it cannot use is
reported by file and field, never with its content; a client key from ``client-key-data`` is
never left on disk; both listen on loopback unless the manifests opt in to the pod network; and
the agent's ``/status`` names pods only to callers on the node itself, unless told otherwise.

It was: a YAML error quoted the line with the bearer token, the key was written under
``/tmp/shoal-agent-*`` and never removed, both listened on 0.0.0.0 by default, and ``/status``
listed every pod on the node to the whole pod network."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster import pki
from nodeagent.wiring import cli as agent_cli
from nodeagent.wiring import health
from scheduler import settings as scheduler_settings
from tests.unit.nodeagent.notice_socket import PODS, SocketAgent
from tests.waiting import STARTS_WITHIN

pytestmark = pytest.mark.reliability

ROOT = Path(__file__).resolve().parents[2]
#: Letters only, so that no window of it turns up in a timestamp or a path by chance.
TOKEN = "tKnZqWvXrPyLmHsJdGfBcNaQeRuTiOpLkJhGfDsA"


def kubeconfig(user: dict[str, Any], server: str = "https://127.0.0.1:6443") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }


def good() -> str:
    return yaml.safe_dump(kubeconfig({"token": TOKEN}), sort_keys=False)


#: Kubeconfigs broken around the token: what a parser error would quote.
MALFORMED = {
    "colon after the token": good().replace(f"token: {TOKEN}", f"token: {TOKEN}: more"),
    "unterminated quote": good().replace(f"token: {TOKEN}", f'token: "{TOKEN}'),
    "tab before the token": good().replace(f"    token: {TOKEN}", f"\ttoken: {TOKEN}"),
    "token as a list item": good().replace(f"token: {TOKEN}", f"token: {TOKEN}\n  - {TOKEN}"),
    "token in the key data": yaml.safe_dump(
        kubeconfig({"client-certificate-data": "eA==", "client-key-data": TOKEN + "!"})
    ),
}

PROGRAMS = {
    "agent": [
        "-m",
        "nodeagent",
        "--node-name",
        "gpu-0",
        "--provider",
        "none",
        "--gpu",
        "off",
        "--listen",
        "127.0.0.1:0",
    ],
    "scheduler": ["-m", "scheduler", "--http-port", "0"],
}


def leaked(text: str, secret: str, window: int = 6) -> list[str]:
    """Every piece of ``secret`` at least ``window`` characters long found in ``text``."""
    return sorted(
        {secret[i : i + window] for i in range(len(secret) - window + 1)} & _windows(text, window)
    )


def _windows(text: str, window: int) -> set[str]:
    return {text[i : i + window] for i in range(len(text) - window + 1)}


#: The official client (the scheduler's loader) decodes key data leniently and starts.
CASES = [
    (program, case)
    for program in PROGRAMS
    for case in MALFORMED
    if not (program == "scheduler" and case == "token in the key data")
]


@pytest.mark.parametrize(("program", "case"), CASES)
def test_a_malformed_kubeconfig_is_reported_by_file_and_field_without_the_token(
    tmp_path: Path, program: str, case: str
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(MALFORMED[case])
    result = subprocess.run(
        [sys.executable, *PROGRAMS[program], "--kubeconfig", str(path)],
        cwd=ROOT,
        env={**os.environ, "SHOAL_SOCKET": str(tmp_path / "agent.sock")},
        capture_output=True,
        text=True,
        timeout=STARTS_WITHIN,
        check=False,
    )
    said = result.stdout + result.stderr
    assert not leaked(said, TOKEN), said
    assert result.returncode == 2, said
    assert str(path) in said
    assert "Traceback" not in said
    if case == "token in the key data":
        assert "client-key-data" in said
    else:
        assert "line" in said


@pytest.fixture
def tmpdir_env(tmp_path: Path) -> Path:
    folder = tmp_path / "tmp"
    folder.mkdir()
    return folder


def test_client_key_data_is_never_left_on_disk_by_the_agent(
    tmp_path: Path, tmpdir_env: Path
) -> None:
    keys = pki.generate(tmp_path / "pki")
    client = keys.clients["admin"]
    key_pem = client.key.read_bytes()
    doc = kubeconfig(
        {
            "client-certificate-data": base64.b64encode(client.cert.read_bytes()).decode(),
            "client-key-data": base64.b64encode(key_pem).decode(),
        },
        # Nothing listens there: the agent starts and retries, which is all this needs.
        server="https://127.0.0.1:9",
    )
    doc["clusters"][0]["cluster"]["certificate-authority-data"] = base64.b64encode(
        keys.ca_cert.read_bytes()
    ).decode()
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(doc))
    key_body = key_pem.decode().splitlines()[1]

    shutil.rmtree(tmp_path / "pki")  # the only copy left is in the kubeconfig
    before = set(Path("/tmp").glob("shoal-agent-*"))

    def key_files() -> list[str]:
        """Files holding the key: in the agent's TMPDIR, shared memory, or new in /tmp."""
        found = [str(p) for p in set(Path("/tmp").glob("shoal-agent-*")) - before]
        for root in (tmpdir_env, Path("/dev/shm")):
            for entry in root.rglob("*"):
                with contextlib.suppress(OSError):
                    if entry.is_file() and key_body.encode() in entry.read_bytes():
                        found.append(str(entry))
        return found

    for stop in (signal.SIGTERM, signal.SIGINT):
        log = (tmp_path / "agent.log").open("w+")
        agent = subprocess.Popen(
            [sys.executable, *PROGRAMS["agent"], "--kubeconfig", str(path)],
            cwd=ROOT,
            env={
                **os.environ,
                "TMPDIR": str(tmpdir_env),
                "SHOAL_SOCKET": str(tmp_path / "agent.sock"),
                "SHOAL_LOG_FORMAT": "json",
            },
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        try:
            deadline = time.monotonic() + STARTS_WITHIN
            while "agent_started" not in (tmp_path / "agent.log").read_text():
                assert agent.poll() is None, (tmp_path / "agent.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "the agent did not start"
                time.sleep(0.1)
            # Running, with the key loaded: it is in memory only.
            assert key_files() == []
            assert list(tmpdir_env.iterdir()) == []
            agent.send_signal(stop)
            assert agent.wait(30) == 0
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
            log.close()
        assert key_files() == []
        assert list(tmpdir_env.iterdir()) == []
    assert not leaked((tmp_path / "agent.log").read_text(), key_body, window=12)


def test_both_programs_listen_on_loopback_unless_the_manifests_opt_in() -> None:
    agent = agent_cli.parser().parse_args(["--node-name", "gpu-0"])
    assert agent.listen == ("127.0.0.1", 9102)
    assert agent.status_pods is False
    defaults = scheduler_settings.resolve([], env={})
    assert (defaults.http_host, defaults.webhook_host) == ("127.0.0.1", "127.0.0.1")
    daemonset = yaml.safe_load((ROOT / "manifests/agent/daemonset.yaml").read_text())
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--listen") + 1] == "0.0.0.0:9102"
    assert "--status-pods" not in args
    deployment = next(
        doc
        for doc in yaml.safe_load_all((ROOT / "manifests/scheduler/deployment.yaml").read_text())
        if doc["kind"] == "Deployment"
    )
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--http-host") + 1] == "0.0.0.0"
    assert args[args.index("--webhook-host") + 1] == "0.0.0.0"


def outward_address() -> str | None:
    """This machine's address on its network (not loopback), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent for a UDP connect
            address = str(probe.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SocketAgent]:
    agent = SocketAgent(tmp_path / "agent.sock")
    agent.start()
    yield agent
    agent.stop()


@pytest.mark.parametrize("status_pods", [False, True], ids=["default", "--status-pods"])
def test_status_names_pods_only_to_callers_on_the_node(
    node: SocketAgent, status_pods: bool
) -> None:
    outward = outward_address()
    if outward is None:
        pytest.skip("this machine has no address besides loopback")
    runner, port = node.call(
        lambda: health.serve(node.a.reports, "0.0.0.0", 0, status_pods=status_pods)
    )
    try:

        def status(host: str) -> dict[str, Any]:
            with urllib.request.urlopen(f"http://{host}:{port}/status", timeout=5) as resp:
                body: dict[str, Any] = json.loads(resp.read())
                return body

        names = {f"{ns}/{name}" for ns, name, _ in PODS}
        local = status("127.0.0.1")
        assert {p["pod"] for p in local["pods"]} == names
        remote = status(outward)  # the peer is this machine's network address
        if status_pods:
            assert {p["pod"] for p in remote["pods"]} == names
        else:
            assert remote["pods"]["count"] == len(PODS)
            assert not any(name in json.dumps(remote) for name in names), remote
            assert "--status-pods" in remote["pods"]["hidden"]
        # Everything else is the same for both.
        assert remote["node"] == local["node"]
        assert remote["channels"] == local["channels"]
    finally:
        node.call(runner.cleanup)
