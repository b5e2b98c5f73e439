"""A devcluster with one real node (kubelet, containerd, runc in a network namespace of its own)
for the tests of this folder, with the images `make images` built imported into its containerd.

Skipped, saying why, where the machine cannot run a kubelet (not root, no cgroups) or where the
images are not built (`make images`).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from devcluster import cluster, images, realnode
from tests.integration.conftest import Devcluster
from tests.waiting import add_machine_wait

IMAGES = (images.OUT_DIR / "shoal-scheduler.oci.tar", images.OUT_DIR / "shoal-agent.oci.tar")
#: The names the archives carry (what a pod's image says, with pullPolicy Never).
SCHEDULER_IMAGE = "localhost/shoal-scheduler:0.1.0"
AGENT_IMAGE = "localhost/shoal-agent:0.1.0"
NODE = "real-0"


def skip_reason() -> str | None:
    reason = realnode.unavailable()
    if reason:
        return f"this machine cannot run a kubelet: {reason}"
    missing = [p.name for p in IMAGES if not p.is_file()]
    if missing:
        return f"the images are not built ({', '.join(missing)}): run `make images`"
    return None


def options(**extra: object) -> cluster.Options:
    return cluster.Options(
        die_with_parent=True,
        kube_scheduler=True,
        real_nodes=1,
        real_node_images=tuple(str(p) for p in IMAGES),
        real_node_labels=("shoal.dev/capacity-type=spot",),
        **extra,  # type: ignore[arg-type]
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that starts a real-node cluster first waits for the machine, up to
    :data:`realnode.MACHINE_WAIT`, while another run's real nodes hold it (one at a time:
    /var/lib/kubelet); that wait falls within the first test's time, so each real-node test gets
    the suite's timeout plus the wait. A run beside another timed out after 600 s in the wait."""
    add_machine_wait(config, items, Path(__file__).parent, realnode.MACHINE_WAIT)


@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory: pytest.TempPathFactory, bin_dir: Path) -> Iterator[Devcluster]:
    """One per module: a machine holds one kubelet at a time (/var/lib/kubelet), so each
    module's cluster is down before the next module's tests, and a test that starts a cluster
    of its own never runs beside another."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    run_dir = tmp_path_factory.mktemp("realnode")
    handle = cluster.up(run_dir, bin_dir, options())
    api = config.new_client_from_config(config_file=str(handle.kubeconfig))
    try:
        yield Devcluster(handle=handle, api=api)
    finally:
        api.close()
        cluster.down(run_dir)
        if os.environ.get("SHOAL_KEEP_LOGS"):
            print(f"devcluster logs kept in {run_dir / 'logs'}")


@pytest.fixture
def real_namespace(real_cluster: Devcluster) -> Iterator[str]:
    name = f"r-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(real_cluster.api)
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        core.delete_namespace(name)
