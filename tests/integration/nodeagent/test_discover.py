"""Horovod host discovery drops pods under notice and pods on revoking nodes."""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any

from contracts import names
from devcluster import nodes
from tests import waiting
from tests.integration.conftest import Devcluster
from tests.integration.nodeagent.harness import eventually, release, worker_pod


def test_discovery_lists_only_hosts_that_can_keep_training(
    devcluster: Devcluster, namespace: str
) -> None:
    core = devcluster.core()
    spec = nodes.NodeSpec(count=2, gpus=8, prefix=f"discover-{uuid.uuid4().hex[:6]}")
    healthy, revoking = nodes.create(devcluster.kubeconfig, spec)
    placed = {"w-0": healthy, "w-1": healthy, "w-2": revoking}
    for name, node in placed.items():
        body = worker_pod(name, node)
        body["metadata"]["labels"]["job"] = "bert"
        core.create_namespaced_pod(namespace, body)
    try:

        def running() -> list[Any] | None:
            pods = core.list_namespaced_pod(namespace, label_selector="job=bert").items
            ready = [p for p in pods if p.status.phase == "Running" and p.status.pod_ip]
            return ready if len(ready) == 3 else None

        pods = {p.metadata.name: p for p in eventually(running, what="3 running workers")}

        def discover(fmt: str = "{name}") -> list[str]:
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "nodeagent.client.discover",
                    "--kubeconfig",
                    devcluster.kubeconfig,
                    "--namespace",
                    namespace,
                    "--selector",
                    "job=bert",
                    "--slots",
                    "4",
                    "--format",
                    fmt,
                ],
                capture_output=True,
                text=True,
                timeout=waiting.STARTS_WITHIN,
                check=True,
            )
            return out.stdout.split()

        assert discover() == ["w-0:4", "w-1:4", "w-2:4"]

        taints = [t.to_dict() for t in core.read_node(revoking).spec.taints or []]
        mark = {"key": names.REVOKING_TAINT, "value": "aws", "effect": "NoSchedule"}
        core.patch_node(revoking, {"spec": {"taints": [*taints, mark]}})
        leave = {names.LEAVE_BY_ANNOTATION: "2026-11-30T10:02:00Z"}
        core.patch_namespaced_pod("w-1", namespace, {"metadata": {"annotations": leave}})
        assert discover() == ["w-0:4"]
        # Horovod's default: the pod IP.
        assert discover("{ip}") == [f"{pods['w-0'].status.pod_ip}:4"]
    finally:
        for name in placed:
            release(core, namespace, name)
        core.delete_node(healthy)
        core.delete_node(revoking)
