"""A real node in the devcluster: a pod runs there as a user would run it (non-root, read-only
root, a hostPath, in-cluster configuration through the ``kubernetes`` Service), gets SIGTERM on
delete, and ``down`` leaves nothing of the node behind."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from devcluster import cluster, realnode
from tests.integration.conftest import Devcluster
from tests.integration.realnode.conftest import AGENT_IMAGE, NODE, options, skip_reason
from tests.waiting import eventually

#: Runs as the pod: reads the API server through the Service's ClusterIP with its own token,
#: records each step in the hostPath folder and leaves on SIGTERM.
POD_PROGRAM = """
import os, signal, ssl, sys, time, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
ctx = ssl.create_default_context(cafile=sa + "/ca.crt")
url = "https://%s:%s/version" % (os.environ["KUBERNETES_SERVICE_HOST"],
                                 os.environ["KUBERNETES_SERVICE_PORT"])
ask = urllib.request.Request(url, headers={"Authorization": "Bearer " + open(sa + "/token").read()})
version = urllib.request.urlopen(ask, context=ctx, timeout=10).read().decode()
try:
    open("/etc/probe", "w")
    root = "writable"
except OSError:
    root = "read-only"
def leave(*_):
    open("/host/sigterm", "w").write(str(time.time()))
    sys.exit(0)
signal.signal(signal.SIGTERM, leave)
open("/host/started.tmp", "w").write("%d %s %s" % (os.getuid(), root, '"gitVersion"' in version))
os.rename("/host/started.tmp", "/host/started")
while True:
    time.sleep(1)
"""


def pod(name: str, host_dir: Path) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 30,
            "securityContext": {"runAsUser": 65532, "runAsGroup": 65532, "runAsNonRoot": True},
            "containers": [
                {
                    "name": "main",
                    "image": AGENT_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", POD_PROGRAM],
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


#: What ``up`` removes when an earlier cluster left it: not compared before and after.
CLEARED_AT_UP = {*realnode.NODE_STATE_PATHS, realnode.KUBELET_ROOT}


def _mounts() -> set[str]:
    return {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}


def _host_pod_netns() -> set[str]:
    """Network namespaces mounted where CNI runtimes put them by default (``/run/netns/cni-*``)."""
    folder = Path("/run/netns")
    return {p.name for p in folder.glob("cni-*")} if folder.is_dir() else set()


def _snapshot(run_dir: Path) -> dict[str, set[str]]:
    """What a real node could leave on the host: mounts, network namespaces and links, cgroups
    named after the run, the fixed host paths, and processes of the run."""
    tag = realnode.network_for(run_dir).tag
    mounts = _mounts()
    netns = set(
        subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    links = set(
        subprocess.run(
            ["ip", "-o", "link"], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    cgroups = {
        str(p)
        for hierarchy in Path("/sys/fs/cgroup").iterdir()
        if hierarchy.is_dir()
        for p in hierarchy.glob(f"shoal-{tag}-*")
    }
    processes = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if str(run_dir).encode() in argv or f"/run/shn{tag}".encode() in argv:
                processes.add(entry.name)
    return {
        "mounts": {m for m in mounts if str(run_dir) in m},
        "netns": {n for n in netns if tag in n},
        "links": {link for link in links if tag in link or link.startswith("cni0")},
        "cgroups": cgroups,
        "paths": (realnode.existing_fixed_paths() - CLEARED_AT_UP)
        | set(map(str, Path("/run").glob(f"shn{tag}*"))),
        "processes": processes,
    }


@pytest.mark.reliability
def test_down_leaves_nothing_of_a_real_node_behind(bin_dir: Path, tmp_path: Path) -> None:
    """First in this folder, before the shared real cluster starts: a machine holds one kubelet
    at /var/lib/kubelet.

    The agent's host folders are the node's disk: a cluster starts without the ones an earlier
    cluster left (once, its agent started from that cluster's pod file, with pods of the same
    node name) and leaves none behind."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    run_dir = tmp_path / "cluster"
    stale = Path("/var/lib/shoal-agent/pods.json")
    stale.parent.mkdir(parents=True, exist_ok=True)
    # This test's own: another run on this machine, waiting for the machine while this cluster
    # starts, writes its own earlier file, which is no file this cluster kept.
    earlier = json.dumps({"node": "real-0", "pods": [], "version": 1, "earlier": str(tmp_path)})
    stale.write_text(earlier)
    before = _snapshot(run_dir)
    host_netns = _host_pod_netns()
    handle = cluster.up(run_dir, bin_dir, options())
    # (An agent run as a host process by another test on this machine may write its own there.)
    assert not (stale.exists() and stale.read_text() == earlier), (
        "a new cluster's node kept an earlier cluster's pod file"
    )
    try:
        host_dir = tmp_path / "host"
        host_dir.mkdir(mode=0o777)
        host_dir.chmod(0o777)
        api = config.new_client_from_config(config_file=str(handle.kubeconfig))
        core = client.CoreV1Api(api)
        core.create_namespaced_pod("default", pod("left-running", host_dir))
        eventually((host_dir / "started").is_file, timeout=60, what="a pod running at down")
        during = _snapshot(run_dir)
        pod_netns = _host_pod_netns() - host_netns
        assert during["netns"], during
        assert during["cgroups"], during
        assert during["mounts"], during
        api.close()
    finally:
        stubborn = cluster.down(run_dir)
    assert stubborn == []
    after = _snapshot(run_dir)
    assert after == before
    # The running pod's network namespace went with its node (once, it stayed mounted in
    # /run/netns after every cluster stopped with pods running).
    assert not pod_netns & _host_pod_netns(), pod_netns
    assert not (stale.exists() and stale.read_text() == earlier)
    assert not [m for m in _mounts() if m.startswith(realnode.KUBELET_ROOT)]
    assert not any(Path(m).exists() for m in during["mounts"] if str(run_dir) in m)
    assert os.path.exists(run_dir / "logs")


def test_a_pod_runs_as_a_user_runs_it_and_hears_sigterm_on_delete(
    real_cluster: Devcluster, real_namespace: str, tmp_path: Path
) -> None:
    host_dir = tmp_path / "host"
    host_dir.mkdir(mode=0o777)
    host_dir.chmod(0o777)
    core = client.CoreV1Api(real_cluster.api)
    core.create_namespaced_pod(real_namespace, pod("plain", host_dir))
    started = eventually(
        lambda: (host_dir / "started").is_file() and (host_dir / "started").read_text(),
        timeout=60,
        what="the pod to start on the real node and read the API server",
    )
    assert started == "65532 read-only True"
    assert core.read_namespaced_pod("plain", real_namespace).status.pod_ip.startswith("10.")

    asked = time.time()
    core.delete_namespaced_pod("plain", real_namespace)

    def gone() -> bool:
        try:
            core.read_namespaced_pod("plain", real_namespace)
        except client.ApiException as exc:
            return bool(exc.status == 404)
        return False

    eventually(gone, timeout=30, what="the pod to be gone after delete")
    took = time.time() - asked
    assert (host_dir / "sigterm").is_file(), "the container never heard SIGTERM"
    assert took < 30, f"gone {took:.1f} s after delete, past its grace period"
