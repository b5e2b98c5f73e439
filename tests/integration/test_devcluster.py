"""The devcluster is a real control plane: objects persist, kwok runs pods, controllers act,
RBAC refuses, and ``down`` leaves nothing behind."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from contracts import gputopology, names
from devcluster import cluster, nodes, process
from tests.integration.conftest import Devcluster
from tests.waiting import eventually

T = TypeVar("T")

KWOK_TOLERATION = {
    "key": names.KWOK_TAINT,
    "operator": "Equal",
    "value": names.KWOK_NODE_VALUE,
    "effect": "NoSchedule",
}


def pod_body(name: str, *, scheduler: str = "nobody-schedules-this") -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "tolerations": [KWOK_TOLERATION],
            "containers": [
                {
                    "name": "worker",
                    "image": "registry.example/trainer:1",
                    "resources": {"limits": {names.GPU_RESOURCE: "2"}},
                }
            ],
        },
    }


def test_gpu_node_is_stored_and_read_back_ready(
    devcluster: Devcluster, gpu_nodes: list[str]
) -> None:
    core = devcluster.core()
    node = core.read_node(gpu_nodes[0])
    assert node.status.allocatable[names.GPU_RESOURCE] == "8"
    assert node.metadata.labels[names.RACK_LABEL] == "rack-0"
    topology = gputopology.decode(node.metadata.annotations[names.GPU_TOPOLOGY_ANNOTATION])
    assert [len(m) for m in topology.islands().values()] == [4, 4]
    spot = [core.read_node(n).metadata.labels[names.CAPACITY_TYPE_LABEL] for n in gpu_nodes]
    assert spot.count("spot") == 2

    def ready() -> bool:
        conditions = core.read_node(gpu_nodes[0]).status.conditions or []
        return any(c.type == "Ready" and c.status == "True" for c in conditions)

    eventually(ready, what="kwok to mark the node Ready")


def test_pod_bound_through_binding_subresource_runs_on_kwok_node(
    devcluster: Devcluster, gpu_nodes: list[str], namespace: str
) -> None:
    core = devcluster.core()
    core.create_namespaced_pod(namespace, pod_body("bound-by-hand"))
    binding = client.V1Binding(
        metadata=client.V1ObjectMeta(name="bound-by-hand"),
        target=client.V1ObjectReference(kind="Node", api_version="v1", name=gpu_nodes[1]),
    )
    # The generated client cannot parse the Status that pods/binding returns; the write is what
    # matters, so the response body is not deserialised.
    core.create_namespaced_pod_binding("bound-by-hand", namespace, binding, _preload_content=False)

    def running() -> Any:
        pod = core.read_namespaced_pod("bound-by-hand", namespace)
        return pod if pod.status.phase == "Running" else None

    pod = eventually(running, what="the bound pod to be Running")
    assert pod.spec.node_name == gpu_nodes[1]
    assert pod.status.pod_ip

    core.delete_namespaced_pod("bound-by-hand", namespace)

    def gone() -> bool:
        try:
            core.read_namespaced_pod("bound-by-hand", namespace)
        except ApiException as exc:
            return bool(exc.status == 404)
        return False

    eventually(gone, what="kwok to finish the pod's deletion")


def test_job_controller_creates_the_jobs_pods(devcluster: Devcluster, namespace: str) -> None:
    template = pod_body("unused")
    job = {
        "metadata": {"name": "trainer"},
        "spec": {
            "completionMode": "Indexed",
            "completions": 3,
            "parallelism": 3,
            "template": {"spec": {**template["spec"], "restartPolicy": "Never"}},
        },
    }
    devcluster.batch().create_namespaced_job(namespace, job)

    def pods() -> list[Any]:
        items = devcluster.core().list_namespaced_pod(namespace, label_selector="job-name=trainer")
        return items.items if len(items.items) == 3 else []

    created = eventually(pods, what="the Job controller to create 3 pods")
    indexes = sorted(
        p.metadata.annotations["batch.kubernetes.io/job-completion-index"] for p in created
    )
    assert indexes == ["0", "1", "2"]
    assert all(p.metadata.owner_references[0].kind == "Job" for p in created)


def test_a_namespace_with_pod_groups_is_deleted(devcluster: Devcluster) -> None:
    """Workloads are on: the API server puts a finalizer on every PodGroup, and the controller
    that removes it runs, so PodGroups (one of an Indexed Job's own) do not hold a namespace."""
    core = devcluster.core()
    name = f"pg-{os.getpid()}"
    core.create_namespace({"metadata": {"name": name}})
    job = {
        "metadata": {"name": "trainer"},
        "spec": {
            "completionMode": "Indexed",
            "completions": 2,
            "parallelism": 2,
            "template": {"spec": {**pod_body("unused")["spec"], "restartPolicy": "Never"}},
        },
    }
    devcluster.batch().create_namespaced_job(name, job)
    custom = client.CustomObjectsApi(devcluster.api)

    def groups() -> list[Any]:
        found = custom.list_namespaced_custom_object(
            "scheduling.k8s.io", "v1beta1", name, "podgroups"
        )
        return list(found["items"])

    [group] = eventually(groups, what="the Job's PodGroup")
    assert "scheduling.k8s.io/podgroup-protection" in group["metadata"]["finalizers"]
    core.delete_namespace(name)

    def gone() -> bool:
        try:
            core.read_namespace(name)
        except ApiException as exc:
            return bool(exc.status == 404)
        return False

    eventually(gone, what="the namespace to be deleted")


def test_service_account_without_rbac_is_refused(devcluster: Devcluster, namespace: str) -> None:
    core = devcluster.core()
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "nobody"}})
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600)
    )
    token = core.create_namespaced_service_account_token("nobody", namespace, request).status.token

    configuration = client.Configuration()
    configuration.host = devcluster.handle.server
    configuration.ssl_ca_cert = str(devcluster.handle.ca_cert)
    configuration.api_key = {"authorization": f"Bearer {token}"}
    with client.ApiClient(configuration) as as_sa:
        who = client.AuthenticationV1Api(as_sa).create_self_subject_review({})
        assert who.status.user_info.username == f"system:serviceaccount:{namespace}:nobody"
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(as_sa).list_namespaced_pod(namespace)
    assert refused.value.status == 403


def test_cli_up_status_down_leaves_no_process(tmp_path: Path, bin_dir: Path) -> None:
    env = {**os.environ, "SHOAL_DEVCLUSTER_RUN_DIR": str(tmp_path / "run")}
    cli = [sys.executable, "-m", "devcluster"]
    kubeconfig = tmp_path / "kube" / "config"
    up = subprocess.run(
        [*cli, "up", "--kubeconfig-out", str(kubeconfig)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert up.returncode == 0, up.stderr
    assert kubeconfig.is_file()
    recorded = cluster.Cluster.load(tmp_path / "run")
    try:
        status = subprocess.run(
            [*cli, "status"], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert status.returncode == 0, status.stdout + status.stderr
        report = json.loads(status.stdout)
        assert set(report["components"]) == {
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kwok",
        }
        kubectl = subprocess.run(
            [str(bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig), "get", "--raw", "/readyz"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert kubectl.stdout.strip() == "ok", kubectl.stderr
    finally:
        down = subprocess.run(
            [*cli, "down"], env=env, capture_output=True, text=True, timeout=120, check=False
        )
    assert down.returncode == 0, down.stderr
    assert [p.name for p in recorded.procs if process.alive(p)] == []
    assert not (tmp_path / "run" / cluster.STATE).exists()
    # Nothing still listens on the API server's port.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", recorded.ports["apiserver"]), timeout=1).close()


def test_stock_scheduler_runs_pods_and_restarts_keep_the_objects(
    tmp_path: Path, bin_dir: Path
) -> None:
    """Benchmarks compare with the stock kube-scheduler; fault-injection tests restart
    components, and what was stored must survive that."""
    options = cluster.Options(die_with_parent=True, kube_scheduler=True)
    handle = cluster.up(tmp_path / "run", bin_dir, options, say=lambda _m: None)
    try:
        api = client.ApiClient(_configuration(handle))
        core = client.CoreV1Api(api)
        nodes.create(str(handle.kubeconfig), nodes.NodeSpec(count=2, prefix="stock"))
        core.create_namespace({"metadata": {"name": "survives"}})
        core.create_namespaced_pod("survives", pod_body("by-stock", scheduler="default-scheduler"))

        def running() -> Any:
            pod = core.read_namespaced_pod("by-stock", "survives")
            return pod if pod.status.phase == "Running" else None

        placed = eventually(running, what="kube-scheduler to place the pod and kwok to run it")
        assert placed.spec.node_name.startswith("stock-")
        old_pids = {p.name: p.pid for p in handle.procs}
        for name in ("etcd", "kube-apiserver"):
            cluster.restart(handle, name, say=lambda _m: None)
        new_pids = {p.name: p.pid for p in cluster.Cluster.load(tmp_path / "run").procs}
        assert new_pids["etcd"] != old_pids["etcd"]
        assert new_pids["kube-apiserver"] != old_pids["kube-apiserver"]
        assert new_pids["kwok"] == old_pids["kwok"]

        def still_there() -> bool:
            try:
                return bool(core.read_namespace("survives").metadata.name == "survives")
            except (ApiException, OSError):
                return False

        eventually(still_there, what="the namespace to be served again after the restarts")
        api.close()
    finally:
        assert cluster.down(tmp_path / "run", say=lambda _m: None) == []


def _configuration(handle: cluster.Cluster) -> Any:
    from kubernetes import config

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(handle.kubeconfig), client_configuration=configuration)
    return configuration


def test_evicted_job_pod_terminates_and_is_replaced(
    devcluster: Devcluster, gpu_nodes: list[str], namespace: str
) -> None:
    """An evicted Job pod ends Failed with DisruptionTarget, so the Job controller replaces it
    (a pod that never terminated would keep the Job's tracking finalizer forever)."""
    template = pod_body("unused")
    job = {
        "metadata": {"name": "elastic"},
        "spec": {
            "completionMode": "Indexed",
            "completions": 1,
            "parallelism": 1,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "Ignore",
                        "onPodConditions": [{"type": "DisruptionTarget"}],
                    }
                ]
            },
            "template": {"spec": {**template["spec"], "restartPolicy": "Never"}},
        },
    }
    devcluster.batch().create_namespaced_job(namespace, job)
    core = devcluster.core()

    def one_pod() -> Any:
        items = core.list_namespaced_pod(namespace, label_selector="job-name=elastic").items
        return items[0] if len(items) == 1 else None

    first = eventually(one_pod, what="the Job's pod")
    core.create_namespaced_pod_binding(
        first.metadata.name,
        namespace,
        client.V1Binding(
            metadata=client.V1ObjectMeta(name=first.metadata.name),
            target=client.V1ObjectReference(kind="Node", api_version="v1", name=gpu_nodes[2]),
        ),
        _preload_content=False,
    )
    eventually(
        lambda: core.read_namespaced_pod(first.metadata.name, namespace).status.phase == "Running",
        what="the Job's pod to run",
    )
    core.create_namespaced_pod_eviction(
        first.metadata.name,
        namespace,
        {"metadata": {"name": first.metadata.name, "namespace": namespace}},
    )

    def replaced() -> Any:
        items = core.list_namespaced_pod(namespace, label_selector="job-name=elastic").items
        fresh = [p for p in items if p.metadata.uid != first.metadata.uid]
        gone = all(p.metadata.uid != first.metadata.uid for p in items)
        return fresh if fresh and gone else None

    eventually(replaced, timeout=30, what="the evicted pod to terminate and be replaced")
    status = devcluster.batch().read_namespaced_job("elastic", namespace).status
    assert not status.failed, "a disruption must not count as a failure of the Job"
