"""The container-runtime stand-in turns a pod as the API server serves it into a process on this
machine: the webhook's wiring (hostPath socket folder, Downward API identity and leave-by file)
lands on the node's folders; a pod being deleted stops as under a kubelet."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

from fakes.runtime import Layout, Runtime, command, downward_files, field_value
from tests.waiting import eventually

ROOT = Path("/tmp/rt")


def wired_pod() -> dict[str, Any]:
    identity = {
        name: {"valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}
        for name, path in (
            ("POD_NAMESPACE", "metadata.namespace"),
            ("POD_NAME", "metadata.name"),
            ("POD_UID", "metadata.uid"),
        )
    }
    return {
        "metadata": {
            "name": "train-0",
            "namespace": "ml",
            "uid": "u-1",
            "annotations": {"shoal.dev/leave-by": "2026-12-01T03:00:00Z"},
        },
        "spec": {
            "nodeName": "gpu-0001",
            "volumes": [
                {"name": "shoal-notice", "hostPath": {"path": "/run/shoal"}},
                {
                    "name": "shoal-leave-by",
                    "downwardAPI": {
                        "items": [
                            {
                                "path": "leave-by",
                                "fieldRef": {
                                    "fieldPath": "metadata.annotations['shoal.dev/leave-by']"
                                },
                            }
                        ]
                    },
                },
                {"name": "data", "persistentVolumeClaim": {"claimName": "x"}},
            ],
            "containers": [
                {
                    "name": "trainer",
                    "command": ["torchrun", "--nnodes=1:3"],
                    "args": ["train.py", "--ckpt=/data/ckpt", "--notes=/etc/shoal/leave-by"],
                    "env": [
                        {"name": "SHOAL_SOCKET", "value": "/run/shoal/agent.sock"},
                        {"name": "SHOAL_LEAVE_BY_FILE", "value": "/etc/shoal/leave-by"},
                        {"name": "MODE", "value": "fast"},
                        {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s"}}},
                        *({"name": k, **v} for k, v in identity.items()),
                    ],
                    "volumeMounts": [
                        {"name": "shoal-notice", "mountPath": "/run/shoal", "readOnly": True},
                        {"name": "shoal-leave-by", "mountPath": "/etc/shoal"},
                        {"name": "data", "mountPath": "/data"},
                    ],
                }
            ],
        },
    }


def test_a_wired_pod_talks_to_its_nodes_socket_and_reads_its_own_files() -> None:
    pod = wired_pod()
    layout = Layout(ROOT)
    process = command(pod, pod["spec"]["containers"][0], layout)

    assert process.env["SHOAL_SOCKET"] == "/tmp/rt/gpu-0001/run/shoal/agent.sock"
    assert process.env["SHOAL_LEAVE_BY_FILE"] == "/tmp/rt/gpu-0001/pods/u-1/shoal-leave-by/leave-by"
    assert (process.env["POD_NAMESPACE"], process.env["POD_NAME"], process.env["POD_UID"]) == (
        "ml",
        "train-0",
        "u-1",
    )
    assert process.env["MODE"] == "fast"
    assert "FROM_SECRET" not in process.env  # not provided, said in the log
    # A volume it cannot provide leaves its paths as they are; an argument's value is mapped.
    assert process.argv == (
        "torchrun",
        "--nnodes=1:3",
        "train.py",
        "--ckpt=/data/ckpt",
        "--notes=/tmp/rt/gpu-0001/pods/u-1/shoal-leave-by/leave-by",
    )
    assert process.cwd == ROOT / "gpu-0001" / "pods" / "u-1"
    assert downward_files(pod, layout) == {
        ROOT / "gpu-0001/pods/u-1/shoal-leave-by/leave-by": "2026-12-01T03:00:00Z"
    }


def test_field_paths_follow_the_downward_api() -> None:
    pod = wired_pod()
    assert field_value(pod, "spec.nodeName") == "gpu-0001"
    assert field_value(pod, "metadata.labels['absent']") == ""
    assert field_value(pod, "status.podIP") == ""
    assert field_value(pod, "spec.containers") is None


def running_pod(command: list[str], *, grace: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"p-{grace}", "namespace": "ml", "uid": f"u-{grace}"},
        "spec": {
            "nodeName": "gpu-0001",
            "terminationGracePeriodSeconds": grace,
            "containers": [{"name": "main", "command": command}],
        },
        "status": {"phase": "Running"},
    }


def test_a_deleted_pod_gets_sigterm_then_sigkill_after_its_grace(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    runtime = Runtime(str(kubeconfig), "ml", ["gpu-0001"], tmp_path)  # never started: no watch
    ready = tmp_path / "ready"
    stubborn = running_pod(
        [
            sys.executable,
            "-c",
            "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            f"pathlib.Path({str(ready)!r}).touch(); time.sleep(600)",
        ],
        grace=1,
    )
    polite = running_pod(["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 0.1; done"], grace=60)
    try:
        runtime.observe(stubborn)
        runtime.observe(polite)
        eventually(ready.exists, timeout=30, what="the stubborn process to ignore SIGTERM")
        for pod in (stubborn, polite):
            pod["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
            runtime.observe(pod)
        codes = eventually(
            lambda: _all_exited(runtime.exit_codes()), timeout=30, what="both processes gone"
        )
        assert codes == {"ml/p-1": -signal.SIGKILL, "ml/p-60": 0}
    finally:
        runtime.close()


def _all_exited(codes: dict[str, dict[str, int | None]]) -> dict[str, int] | None:
    flat = {key: c["main"] for key, c in codes.items()}
    if len(flat) < 2 or any(code is None for code in flat.values()):
        return None
    return {key: int(code) for key, code in flat.items() if code is not None}


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""
