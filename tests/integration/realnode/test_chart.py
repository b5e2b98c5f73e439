"""The chart installed as users install it, on a real node, with the images `make images`
built (pullPolicy Never): the scheduler Deployment and the agent DaemonSet become Ready through
their own probes, the agent finds its cloud at 169.254.169.254 with the chart's defaults (a fake
AWS metadata server the node's namespace routes that address to), and a spot notice reaches a
worker container wired by the scheduler's webhook through the hostPath socket."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devcluster import realnode, tools
from fakes.metadata import Threaded
from fakes.node_metadata import HostAwsMetadata
from tests.integration.conftest import Devcluster
from tests.integration.realnode.conftest import NODE
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "shoal"
RELEASE_NS = "shoal-system"
#: A uid other than the agent's (65532): the socket's folder is shared through its group.
WORKER_UID = 1000

#: The worker: waits on the agent's socket with the worker library, records what it heard and
#: when, acknowledges its checkpoint, and records SIGTERM.
WORKER = """
import json, os, signal, subprocess, sys, time
def leave(*_):
    open("/host/sigterm", "w").write(repr(time.time()))
    sys.exit(0)
signal.signal(signal.SIGTERM, leave)
heard = subprocess.run([sys.executable, "-m", "nodeagent.client", "wait"],
                       capture_output=True, text=True)
open("/host/notice.tmp", "w").write(json.dumps(
    {"at": time.time(), "rc": heard.returncode, "out": heard.stdout, "err": heard.stderr[-2000:]}))
os.rename("/host/notice.tmp", "/host/notice")
acked = subprocess.run([sys.executable, "-m", "nodeagent.client", "ack", "1"],
                       capture_output=True, text=True)
open("/host/ack", "w").write(str(acked.returncode) + " " + acked.stderr[-500:])
while True:
    time.sleep(1)
"""


def helm_install(helm: Path, kubeconfig: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(helm), "--kubeconfig", kubeconfig, "--namespace", RELEASE_NS,
            "install", "shoal", str(CHART), "--create-namespace",
            "--set", "images.scheduler.repository=localhost/shoal-scheduler",
            "--set", "images.agent.repository=localhost/shoal-agent",
            "--set", "images.pullPolicy=Never",
            "--wait", "--timeout", "180s",
        ],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def installed(real_cluster: Devcluster) -> Iterator[dict[str, Any]]:
    handle = real_cluster.handle
    network = realnode.network_for(handle.run_dir)
    fakes = Threaded()
    aws = fakes.start(HostAwsMetadata(network.host_ip))
    realnode.route(handle.real_node(NODE), realnode.METADATA_IP, 80, f"{aws.host}:{aws.port}")
    helm = tools.ensure("helm")
    started = time.monotonic()
    done = helm_install(helm, real_cluster.kubeconfig)
    took = time.monotonic() - started
    try:
        assert done.returncode == 0, done.stderr
        yield {"aws": aws, "fakes": fakes, "install_seconds": took}
    finally:
        subprocess.run(
            [str(helm), "--kubeconfig", real_cluster.kubeconfig, "--namespace", RELEASE_NS,
             "uninstall", "shoal", "--wait"],
            capture_output=True, timeout=120, check=False,
        )  # fmt: skip
        fakes.close()


def test_install_gives_ready_pods_on_the_real_node(
    real_cluster: Devcluster, installed: dict[str, Any]
) -> None:
    core = client.CoreV1Api(real_cluster.api)
    pods = core.list_namespaced_pod(RELEASE_NS).items
    names = sorted(p.metadata.labels["app.kubernetes.io/name"] for p in pods)
    assert names == ["shoal-agent", "shoal-scheduler", "shoal-scheduler"]
    for pod in pods:
        assert pod.spec.node_name == NODE
        ready = {c.type: c.status for c in pod.status.conditions}
        assert ready["Ready"] == "True", pod.metadata.name
    print(f"helm install -> every pod Ready: {installed['install_seconds']:.1f} s")
    aws: HostAwsMetadata = installed["aws"]
    assert any(path.startswith("/latest/meta-data/") for _, path in aws.requests)


def worker_pod(name: str, host_dir: Path) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "shoal-scheduler",
            "terminationGracePeriodSeconds": 30,
            "securityContext": {
                "runAsUser": WORKER_UID,
                "runAsGroup": WORKER_UID,
                "supplementalGroups": [65532],
                "runAsNonRoot": True,
            },
            "containers": [
                {
                    "name": "worker",
                    "image": "localhost/shoal-agent:0.1.0",
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", WORKER],
                    "securityContext": {
                        "readOnlyRootFilesystem": True,
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [{"name": "host", "mountPath": "/host"}],
                }
            ],
            "volumes": [{"name": "host", "hostPath": {"path": str(host_dir), "type": "Directory"}}],
        },
    }


def test_a_spot_notice_reaches_the_worker_container_which_leaves_before_the_deadline(
    real_cluster: Devcluster, installed: dict[str, Any], real_namespace: str, tmp_path: Path
) -> None:
    core = client.CoreV1Api(real_cluster.api)
    host_dir = tmp_path / "worker"
    host_dir.mkdir()
    host_dir.chmod(0o777)
    core.create_namespaced_pod(real_namespace, worker_pod("worker", host_dir))
    pod = eventually(
        lambda: (
            (p := core.read_namespaced_pod("worker", real_namespace)).status.phase == "Running"
            and p
        ),
        timeout=120,
        what="the worker to run on the real node",
    )
    assert pod.spec.node_name == NODE
    assert any(v.name == "shoal-notice" for v in pod.spec.volumes), "the webhook did not wire it"

    aws: HostAwsMetadata = installed["aws"]
    fakes: Threaded = installed["fakes"]
    deadline = datetime.now(UTC) + timedelta(minutes=2)
    noticed = time.time()
    fakes.call(
        lambda: setattr(
            aws,
            "instance_action",
            {"action": "terminate", "time": deadline.strftime("%Y-%m-%dT%H:%M:%SZ")},
        )
    )
    eventually(
        (host_dir / "notice").is_file, timeout=60, what="the worker container to hear the notice"
    )
    record = json.loads((host_dir / "notice").read_text())
    assert record["rc"] == 0, record
    print(f"notice -> worker container heard: {record['at'] - noticed:.2f} s")

    def gone() -> bool:
        try:
            core.read_namespaced_pod("worker", real_namespace)
        except client.ApiException as exc:
            return bool(exc.status == 404)
        return False

    eventually(gone, timeout=90, what="the agent to evict the worker and the pod to be gone")
    assert datetime.now(UTC) < deadline
    assert (host_dir / "sigterm").is_file(), "the kubelet never delivered SIGTERM"
    node = core.read_node(NODE)
    assert any("shoal" in (t.key or "") for t in node.spec.taints or []), node.spec.taints
