"""Feature gates reach every component; workloads bring the controller that lets PodGroups go."""

from __future__ import annotations

from pathlib import Path

from devcluster import cli, cluster, pki


def test_up_reads_feature_gates_and_runtime_config() -> None:
    args = cli.parser().parse_args(
        [
            "up",
            "--feature-gates",
            "GenericWorkload=true, WorkloadWithJob=true",
            "--runtime-config",
            "scheduling.k8s.io/v1beta1=true",
        ]
    )
    assert cli._items(args.feature_gates) == ("GenericWorkload=true", "WorkloadWithJob=true")
    assert cli._items(args.runtime_config) == ("scheduling.k8s.io/v1beta1=true",)
    assert cli._items("") == ()


def test_gates_go_to_every_component_and_workloads_add_podgroup_protection(
    tmp_path: Path,
) -> None:
    keys = pki.generate(tmp_path / "pki")
    ports = {name: 1 for name in ("etcd", "apiserver", "controller_manager", "scheduler")}
    on = cluster.Options(
        feature_gates=("GenericWorkload=true",), runtime_config=("scheduling.k8s.io/v1beta1=true",)
    )
    apiserver = cluster._apiserver_argv(tmp_path, keys, ports, on)
    manager = cluster._controller_manager_argv(tmp_path, tmp_path, keys, ports, on)
    scheduler = cluster._scheduler_argv(tmp_path, tmp_path, ports, on)
    for argv in (apiserver, manager, scheduler):
        assert "--feature-gates=GenericWorkload=true" in argv
    assert "--runtime-config=scheduling.k8s.io/v1beta1=true" in apiserver
    [controllers] = [a for a in manager if a.startswith("--controllers=")]
    assert "podgroup-protection-controller" in controllers

    off = cluster.Options()
    manager = cluster._controller_manager_argv(tmp_path, tmp_path, keys, ports, off)
    assert not any(a.startswith("--feature-gates") for a in manager)
    assert not any("podgroup-protection" in a for a in manager)


def test_node_monitor_grace_period_reaches_the_controller_manager_only_when_set(
    tmp_path: Path,
) -> None:
    keys = pki.generate(tmp_path / "pki")
    ports = {name: 1 for name in ("etcd", "apiserver", "controller_manager", "scheduler")}
    patient = cluster.Options(node_monitor_grace_period="10m")
    manager = cluster._controller_manager_argv(tmp_path, tmp_path, keys, ports, patient)
    assert "--node-monitor-grace-period=10m" in manager
    default = cluster._controller_manager_argv(tmp_path, tmp_path, keys, ports, cluster.Options())
    assert not any(a.startswith("--node-monitor-grace-period") for a in default)
