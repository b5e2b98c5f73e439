"""One devcluster for the whole test session, started from the cached binaries.

Under pytest-xdist each worker is a session of its own, with its own devcluster (on free ports),
so tests on different workers never see each other's nodes, CRDs or cluster-wide objects.
The components are started with ``die_with_parent`` so a killed test run leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from devcluster import build, cluster, nodes, versions
from tests.integration.history import History


@dataclass(frozen=True, slots=True)
class Devcluster:
    handle: cluster.Cluster
    api: Any  # kubernetes.client.ApiClient

    @property
    def kubeconfig(self) -> str:
        return str(self.handle.kubeconfig)

    def core(self) -> Any:
        return client.CoreV1Api(self.api)

    def batch(self) -> Any:
        return client.BatchV1Api(self.api)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.path):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def bin_dir() -> Path:
    """The cached control-plane binaries; xdist workers take turns, so only one builds."""
    root = versions.cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return build.build()


@pytest.fixture(scope="session")
def devcluster(tmp_path_factory: pytest.TempPathFactory, bin_dir: Path) -> Iterator[Devcluster]:
    run_dir = tmp_path_factory.mktemp("devcluster")
    handle = cluster.up(
        run_dir,
        bin_dir,
        cluster.Options(
            die_with_parent=True,
            feature_gates=cluster.WORKLOAD_GATES,
            runtime_config=cluster.WORKLOAD_RUNTIME_CONFIG,
        ),
    )
    api = config.new_client_from_config(config_file=str(handle.kubeconfig))
    try:
        yield Devcluster(handle=handle, api=api)
    finally:
        api.close()
        cluster.down(run_dir)
        if os.environ.get("SHOAL_KEEP_LOGS"):
            print(f"devcluster logs kept in {run_dir / 'logs'}")


@pytest.fixture
def namespace(devcluster: Devcluster) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    core = devcluster.core()
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        core.delete_namespace(name)


@pytest.fixture
def pod_history(devcluster: Devcluster, namespace: str) -> Iterator[History]:
    """Every version of the test namespace's pods from the start of the test: what a test
    asserts about states that come and go is read here, never from a poll that can miss them."""
    history = History(devcluster.core().list_namespaced_pod, namespace)
    yield history
    history.close()


@pytest.fixture(scope="session")
def gpu_nodes(devcluster: Devcluster) -> list[str]:
    """Four kwok GPU nodes (8 GPUs each, two racks, half spot) shared by the session."""
    spec = nodes.NodeSpec(count=4, gpus=8, prefix="itest-gpu", spot_fraction=0.5)
    return nodes.create(devcluster.kubeconfig, spec)


def token_kubeconfig(devcluster: Devcluster, namespace: str, account: str, path: Path) -> str:
    """A kubeconfig at ``path`` with a fresh token of the ServiceAccount ``account`` (what a pod
    of that account would get as its projected token), context namespace ``namespace``."""
    core = devcluster.core()
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    )
    token = core.create_namespaced_service_account_token(account, namespace, request)
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "dev",
                "cluster": {
                    "server": devcluster.handle.server,
                    "certificate-authority": str(devcluster.handle.ca_cert),
                },
            }
        ],
        "users": [{"name": account, "user": {"token": token.status.token}}],
        "contexts": [
            {
                "name": account,
                "context": {"cluster": "dev", "user": account, "namespace": namespace},
            }
        ],
        "current-context": account,
    }
    path.write_text(json.dumps(doc))
    return str(path)


@contextlib.contextmanager
def account_kubeconfig(
    devcluster: Devcluster,
    namespace: str,
    account: str,
    rules: list[dict[str, Any]],
    path: Path,
    *,
    role: str,
) -> Iterator[str]:
    """A ServiceAccount ``account`` bound (through the ClusterRole ``role``) to ``rules`` only,
    as a token kubeconfig at ``path`` whose context namespace is ``namespace``; the role and
    binding are deleted afterwards."""
    core = devcluster.core()
    rbac = client.RbacAuthorizationV1Api(devcluster.api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    rbac.create_cluster_role({"metadata": {"name": role}, "rules": rules})
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": role},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        }
    )
    try:
        yield token_kubeconfig(devcluster, namespace, account, path)
    finally:
        rbac.delete_cluster_role_binding(role)
        rbac.delete_cluster_role(role)
