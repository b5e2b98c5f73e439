"""What a platform engineer installs works, and grants no more than it needs.

The manifests are applied to the devcluster with server-side apply; the scheduler and the agent
then run with the tokens of the ServiceAccounts those manifests create (not as admin), which
proves the RBAC sufficient; SubjectAccessReviews prove it is not excessive.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from shoal_worker import PodIdentity

from contracts import names
from devcluster import nodes
from fakes import metadata
from tests.integration.conftest import Devcluster
from tests.integration.nodeagent.harness import (
    AgentProcess,
    Aws,
    Worker,
    disruption_target,
    eventually,
    release,
    taint,
    worker_pod,
)
from tests.integration.scheduler import training_operator
from tests.integration.scheduler.conftest import VOLCANO_CRD, SchedulerProcess, apply_crd

ROOT = Path(__file__).resolve().parents[3]
MANIFESTS = ROOT / "manifests"
NAMESPACE = "shoal-system"
SCHEDULER_SA = f"system:serviceaccount:{NAMESPACE}:shoal-scheduler"
AGENT_SA = f"system:serviceaccount:{NAMESPACE}:shoal-agent"


def kubectl(devcluster: Devcluster, bin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / "kubectl"), "--kubeconfig", devcluster.kubeconfig, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def installed(devcluster: Devcluster, bin_dir: Path) -> Iterator[subprocess.CompletedProcess[str]]:
    applied = kubectl(
        devcluster,
        bin_dir,
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=shoal-install",
        "-k",
        str(MANIFESTS),
    )
    yield applied
    # The workloads would wait for images forever on kwok; the RBAC and CRD may stay. The
    # webhook configuration goes: its Service has no endpoint here, and other tests' pods
    # would wait for its timeout.
    kubectl(
        devcluster,
        bin_dir,
        "delete",
        "-n",
        NAMESPACE,
        "daemonset/shoal-agent",
        "deployment/shoal-scheduler",
        "service/shoal-scheduler-webhook",
        "--ignore-not-found",
        "--wait=false",
    )
    kubectl(
        devcluster,
        bin_dir,
        "delete",
        "mutatingwebhookconfiguration/shoal-scheduler",
        "--ignore-not-found",
    )


def token_kubeconfig(
    devcluster: Devcluster, account: str, path: Path, bound_to: Any | None = None
) -> str:
    """A kubeconfig that authenticates as the ServiceAccount, with a short-lived token; bound to
    the pod ``bound_to`` (as the token Kubernetes mounts into a pod is: it then names the pod's
    node) when given."""
    bound = None
    if bound_to is not None:
        bound = client.V1BoundObjectReference(
            api_version="v1", kind="Pod", name=bound_to.metadata.name, uid=bound_to.metadata.uid
        )
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(
            audiences=[], expiration_seconds=3600, bound_object_ref=bound
        )
    )
    token = (
        devcluster.core()
        .create_namespaced_service_account_token(account, NAMESPACE, request)
        .status.token
    )
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
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "dev", "context": {"cluster": "dev", "user": account}}],
        "current-context": "dev",
    }
    path.write_text(json.dumps(doc))
    return str(path)


def test_every_manifest_applies_server_side(
    installed: subprocess.CompletedProcess[str], devcluster: Devcluster
) -> None:
    assert installed.returncode == 0, installed.stderr
    lines = installed.stdout.splitlines()
    for expected in (
        "namespace/shoal-system",
        "customresourcedefinition.apiextensions.k8s.io/podgroups",
        "clusterrole.rbac.authorization.k8s.io/shoal-scheduler",
        "deployment.apps/shoal-scheduler",
        "poddisruptionbudget.policy/shoal-scheduler",
        "daemonset.apps/shoal-agent",
        "clusterrole.rbac.authorization.k8s.io/shoal-agent",
        "configmap/shoal-scheduler",
        "service/shoal-scheduler-webhook",
        "mutatingwebhookconfiguration.admissionregistration.k8s.io/shoal-scheduler",
    ):
        assert any(line.startswith(expected) for line in lines), (expected, lines)
    deployment = client.AppsV1Api(devcluster.api).read_namespaced_deployment(
        "shoal-scheduler", NAMESPACE
    )
    assert deployment.spec.replicas == 2


def test_examples_pass_server_side_dry_run(
    installed: subprocess.CompletedProcess[str], devcluster: Devcluster, bin_dir: Path
) -> None:
    training_operator.apply_crds(devcluster)  # PyTorchJob and MPIJob, as that module ships them
    apply_crd(devcluster, VOLCANO_CRD)
    examples = sorted((MANIFESTS / "examples").glob("*.yaml"))
    assert len(examples) == 6
    for example in examples:
        result = kubectl(
            devcluster, bin_dir, "apply", "--server-side", "--dry-run=server", "-f", str(example)
        )
        assert result.returncode == 0, f"{example.name}: {result.stderr}"


def test_daemonset_targets_gpu_and_spot_nodes_only(
    installed: subprocess.CompletedProcess[str], devcluster: Devcluster
) -> None:
    tag = uuid.uuid4().hex[:6]
    gpu = nodes.create(devcluster.kubeconfig, nodes.NodeSpec(count=2, prefix=f"ds-gpu-{tag}"))
    spot_cpu = nodes.create(
        devcluster.kubeconfig,
        nodes.NodeSpec(count=1, gpus=0, prefix=f"ds-spot-{tag}", spot_fraction=1.0),
    )
    plain = nodes.create(
        devcluster.kubeconfig, nodes.NodeSpec(count=1, gpus=0, prefix=f"ds-cpu-{tag}")
    )
    core = devcluster.core()
    try:

        def targets() -> set[str]:
            found = set()
            for pod in core.list_namespaced_pod(
                NAMESPACE, label_selector="app.kubernetes.io/name=shoal-agent"
            ).items:
                required = pod.spec.affinity.node_affinity
                selector = required.required_during_scheduling_ignored_during_execution
                for term in selector.node_selector_terms:
                    for field in term.match_fields or []:
                        found.update(field.values)
            return found

        wanted = set(gpu + spot_cpu)
        found: set[str] = eventually(
            lambda: ((seen := targets()) >= wanted and seen) or None,
            timeout=60,
            what="the DaemonSet controller to create agent pods",
        )
        assert not set(plain) & found
        pod = next(
            p
            for p in core.list_namespaced_pod(
                NAMESPACE, label_selector="app.kubernetes.io/name=shoal-agent"
            ).items
        )
        assert pod.spec.priority_class_name == "system-node-critical"
        tolerated = [t for t in pod.spec.tolerations if t.operator == "Exists" and not t.key]
        assert tolerated, "the agent must tolerate its own revoking taint"
    finally:
        for name in gpu + spot_cpu + plain:
            core.delete_node(name)


ALLOWED = [
    (SCHEDULER_SA, "create", "pods", "binding", "", None),
    (SCHEDULER_SA, "watch", "pods", "", "", None),
    (SCHEDULER_SA, "list", "nodes", "", "", None),
    (SCHEDULER_SA, "patch", "pods", "status", "", None),
    (SCHEDULER_SA, "create", "pods", "eviction", "", None),
    (SCHEDULER_SA, "patch", "podgroups", "status", "scheduling.x-k8s.io", None),
    (SCHEDULER_SA, "watch", "podgroups", "", "scheduling.volcano.sh", None),
    (SCHEDULER_SA, "patch", "podgroups", "", "scheduling.volcano.sh", None),
    (SCHEDULER_SA, "watch", "priorityclasses", "", "scheduling.k8s.io", None),
    (SCHEDULER_SA, "watch", "podgroups", "", "scheduling.k8s.io", None),
    (SCHEDULER_SA, "patch", "podgroups", "status", "scheduling.k8s.io", None),
    (SCHEDULER_SA, "update", "leases", "", "coordination.k8s.io", NAMESPACE),
    (AGENT_SA, "patch", "nodes", "", "", None),
    (AGENT_SA, "create", "pods", "eviction", "", None),
    (AGENT_SA, "list", "pods", "", "", None),
    (AGENT_SA, "watch", "pods", "", "", None),
    (AGENT_SA, "create", "events", "", "", None),
    (AGENT_SA, "list", "events", "", "", None),
    # Its own Node is watched by field selector; RBAC cannot say "own node" for reads.
    (AGENT_SA, "watch", "nodes", "", "", None),
    (AGENT_SA, "watch", "events", "", "", None),
]
DENIED = [
    (account, verb, resource, sub, group, ns)
    for account in (SCHEDULER_SA, AGENT_SA)
    for verb, resource, sub, group, ns in [
        ("get", "secrets", "", "", None),
        ("list", "secrets", "", "", NAMESPACE),
        ("delete", "nodes", "", "", None),
        ("create", "pods", "", "", None),
        ("create", "serviceaccounts", "token", "", NAMESPACE),
        ("update", "clusterroles", "", "rbac.authorization.k8s.io", None),
    ]
] + [
    (SCHEDULER_SA, "patch", "nodes", "", "", None),
    (SCHEDULER_SA, "update", "leases", "", "coordination.k8s.io", "kube-system"),
    (AGENT_SA, "create", "pods", "binding", "", None),
    (AGENT_SA, "update", "leases", "", "coordination.k8s.io", NAMESPACE),
    (AGENT_SA, "update", "nodes", "", "", None),
    (AGENT_SA, "delete", "events", "", "", None),
]


def _review(devcluster: Devcluster, case: tuple[Any, ...]) -> bool:
    account, verb, resource, sub, group, namespace = case
    body = {
        "spec": {
            "user": account,
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{NAMESPACE}",
                "system:authenticated",
            ],
            "resourceAttributes": {
                "verb": verb,
                "resource": resource,
                "subresource": sub,
                "group": group,
                **({"namespace": namespace} if namespace else {}),
            },
        }
    }
    review = client.AuthorizationV1Api(devcluster.api).create_subject_access_review(body)
    return bool(review.status.allowed)


@pytest.mark.parametrize(
    "case", ALLOWED, ids=lambda c: f"{c[0].rsplit(':', 1)[1]}-{c[1]}-{c[2]}/{c[3]}"
)
def test_rbac_grants_what_each_program_needs(
    installed: subprocess.CompletedProcess[str], devcluster: Devcluster, case: tuple[Any, ...]
) -> None:
    assert _review(devcluster, case), case


@pytest.mark.parametrize(
    "case", DENIED, ids=lambda c: f"{c[0].rsplit(':', 1)[1]}-{c[1]}-{c[2]}/{c[3]}-{c[5]}"
)
def test_rbac_refuses_what_neither_needs(
    installed: subprocess.CompletedProcess[str], devcluster: Devcluster, case: tuple[Any, ...]
) -> None:
    assert not _review(devcluster, case), case


def test_scheduler_with_its_own_service_account_schedules_a_gang(
    installed: subprocess.CompletedProcess[str],
    devcluster: Devcluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    tag = uuid.uuid4().hex[:6]
    pool = nodes.create(
        devcluster.kubeconfig,
        nodes.NodeSpec(count=2, prefix=f"rbac-{tag}", extra_labels={"shoal.dev/test-pool": tag}),
    )
    name = f"shoal-rbac-{tag}"
    kubeconfig = token_kubeconfig(devcluster, "shoal-scheduler", tmp_path / "sa.kubeconfig")
    scheduler = SchedulerProcess(
        kubeconfig,
        name,
        tmp_path,
        extra=[
            "--leader-elect",
            "true",
            "--lease-namespace",
            NAMESPACE,
            # Its webhook keeps its CA in the installed configuration (sent no pod here: the
            # configuration matches shoal-scheduler's pods only).
            "--webhook",
            "true",
            "--webhook-port",
            "0",
            "--webhook-hosts",
            "127.0.0.1",
        ],
    ).start()
    admission = client.AdmissionregistrationV1Api(devcluster.api)
    core = devcluster.core()
    try:
        for i in range(2):
            core.create_namespaced_pod(
                namespace,
                {
                    "metadata": {
                        "name": f"w-{i}",
                        "labels": {names.GANG_LABEL: "job"},
                        "annotations": {names.MIN_MEMBER_ANNOTATION: "2"},
                    },
                    "spec": {
                        "schedulerName": name,
                        "nodeSelector": {"shoal.dev/test-pool": tag},
                        "tolerations": [{"key": names.KWOK_TAINT, "operator": "Exists"}],
                        "containers": [
                            {
                                "name": "w",
                                "image": "trainer",
                                "resources": {"limits": {names.GPU_RESOURCE: "8"}},
                            }
                        ],
                    },
                },
            )

        def both_running() -> bool:
            pods = [core.read_namespaced_pod(f"w-{i}", namespace) for i in range(2)]
            return all(p.status.phase == "Running" for p in pods)

        eventually(both_running, timeout=90, what="the gang bound by the scheduler's own account")
        placed = {core.read_namespaced_pod(f"w-{i}", namespace).spec.node_name for i in range(2)}
        assert placed == set(pool)
        lease = client.CoordinationV1Api(devcluster.api).read_namespaced_lease(name, NAMESPACE)
        assert lease.spec.holder_identity
        eventually(
            lambda: (
                admission.read_mutating_webhook_configuration("shoal-scheduler")
                .webhooks[0]
                .client_config.ca_bundle
            ),
            what="the webhook's CA in the installed configuration, by the scheduler's account",
        )
    finally:
        assert scheduler.stop() == 0
        for node in pool:
            core.delete_node(node)


def test_agent_with_its_own_service_account_taints_and_evicts(
    installed: subprocess.CompletedProcess[str],
    devcluster: Devcluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    core = devcluster.core()
    (node,) = nodes.create(
        devcluster.kubeconfig, nodes.NodeSpec(count=1, prefix=f"rbac-agent-{uuid.uuid4().hex[:6]}")
    )
    created = core.create_namespaced_pod(namespace, worker_pod("trainer-0", node))
    identity = PodIdentity(namespace, "trainer-0", created.metadata.uid)
    servers = metadata.Threaded()
    cloud = Aws(servers)
    own = agent_pod(devcluster, node)
    agent = AgentProcess(
        kubeconfig=token_kubeconfig(devcluster, "shoal-agent", tmp_path / "sa.kubeconfig", own),
        node=node,
        provider="aws",
        metadata_url=cloud.url,
        workdir=tmp_path,
    )
    agent.start()
    worker = Worker(identity, agent.socket_path)
    try:
        assert worker.next().state == "none"
        cloud.post()
        worker.until("leave")
        eventually(lambda: taint(core.read_node(node)), what="the revoking taint")
        assert worker.acknowledge(7) == "accepted"
        eventually(
            lambda: disruption_target(core.read_namespaced_pod("trainer-0", namespace)),
            what="the eviction by the agent's own account",
        )
    finally:
        worker.close()
        agent.stop()
        servers.close()
        release(core, namespace, "trainer-0")
        # The agent drained it with the rest of the node (it belongs to no DaemonSet).
        with contextlib.suppress(ApiException):
            core.delete_namespaced_pod(own.metadata.name, NAMESPACE, grace_period_seconds=0)
        core.delete_node(node)


def agent_pod(devcluster: Devcluster, node: str) -> Any:
    """The DaemonSet's pod on ``node`` as far as tokens go: the agent's account, bound there."""
    body = {
        "metadata": {"name": f"shoal-agent-{node}"},
        "spec": {
            "nodeName": node,
            "serviceAccountName": "shoal-agent",
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "agent", "image": "ghcr.io/shoal-dev/shoal-agent:0.1.0"}],
        },
    }
    return devcluster.core().create_namespaced_pod(NAMESPACE, body)


def _refused(call: Any) -> str:
    """The API server's message for a call that must be refused with 403."""
    with pytest.raises(ApiException) as refused:
        call()
    assert refused.value.status == 403, refused.value.body
    return str(json.loads(refused.value.body)["message"])


def test_each_agent_changes_only_its_own_node_and_its_pods(
    installed: subprocess.CompletedProcess[str],
    devcluster: Devcluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    core = devcluster.core()
    node_a, node_b = nodes.create(
        devcluster.kubeconfig, nodes.NodeSpec(count=2, prefix=f"own-{uuid.uuid4().hex[:6]}")
    )
    for name, node in (("on-a", node_a), ("on-b", node_b)):
        core.create_namespaced_pod(namespace, worker_pod(name, node))
    own = agent_pod(devcluster, node_a)
    bound = token_kubeconfig(devcluster, "shoal-agent", tmp_path / "bound.kubeconfig", own)
    agent = client.CoreV1Api(config.new_client_from_config(config_file=bound))
    note = {"metadata": {"annotations": {names.REVOCATION_ANNOTATION: "{}"}}}
    try:
        agent.patch_node(node_a, note)
        agent.patch_namespaced_pod("on-a", namespace, {"metadata": {"annotations": {"x": "1"}}})
        message = _refused(lambda: agent.patch_node(node_b, note))
        assert f"shoal-agent on node {node_a} may change only its own node, not {node_b}" in message
        message = _refused(lambda: agent.delete_namespaced_pod("on-b", namespace))
        assert f"may change only the pods bound to it, not {namespace}/on-b" in message
        # A token not bound to a pod names no node: nothing of any node.
        loose = token_kubeconfig(devcluster, "shoal-agent", tmp_path / "loose.kubeconfig")
        unbound = client.CoreV1Api(config.new_client_from_config(config_file=loose))
        assert "the token names no node" in _refused(lambda: unbound.patch_node(node_a, note))
    finally:
        for name in ("on-a", "on-b"):
            release(core, namespace, name)
        core.delete_namespaced_pod(own.metadata.name, NAMESPACE, grace_period_seconds=0)
        for node in (node_a, node_b):
            core.delete_node(node)
