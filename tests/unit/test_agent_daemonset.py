"""The agent's DaemonSet as shipped: what the NVIDIA container toolkit needs to mount NVML into a
pod that asks for no GPU, and nothing that would take a GPU from the workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from contracts import names

DAEMONSET = Path(__file__).resolve().parents[2] / "manifests" / "agent" / "daemonset.yaml"


def agent_container() -> tuple[dict[str, Any], dict[str, Any]]:
    body = yaml.safe_load(DAEMONSET.read_text())
    pod = body["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "agent"]
    return pod, container


def test_the_toolkit_is_asked_for_every_gpu_and_only_the_nvml_capability() -> None:
    _, container = agent_container()
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


def test_the_agent_takes_no_gpu_and_runs_as_non_root() -> None:
    pod, container = agent_container()
    resources = container.get("resources", {})
    for kind in ("requests", "limits"):
        assert names.GPU_RESOURCE not in resources.get(kind, {})
    assert container["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
