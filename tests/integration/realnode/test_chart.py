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
from kubernetes import client, watch

from contracts import names
from devcluster import realnode, tools
from fakes.metadata import Threaded
from fakes.node_metadata import HostAwsMetadata
from tests.integration.conftest import Devcluster
from tests.integration.realnode.conftest import AGENT_IMAGE, NODE
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "shoal"
RELEASE_NS = "shoal-system"
#: A uid other than the agent's (65532): the socket's folder is shared through its group.
WORKER_UID = 1000

#: The worker, with the worker library: holds a watch on the agent's socket and records each
#: leave notice it hears (the first of each watch) as ``heard-N`` in its hostPath folder, and a
#: watch the agent ended as ``lost-N``; it watches again at once, as a worker should. After
#: ``ACK_AFTER`` notices it acknowledges its checkpoint (``ack``); SIGTERM is recorded.
WORKER = """
import json, os, signal, time
def record(name, doc):
    with open("/host/%s.tmp" % name, "w") as f:
        f.write(json.dumps(doc))
    os.rename("/host/%s.tmp" % name, "/host/" + name)
def leave(*_):
    record("sigterm", {"at": time.time()})
    os._exit(0)
# First, before the imports: PID 1 ignores a SIGTERM it has no handler for.
signal.signal(signal.SIGTERM, leave)
import asyncio
from nodeagent.client import NoticeClient
ACK_AFTER = int(os.environ.get("ACK_AFTER", "1"))
async def main():
    client = NoticeClient.from_env()
    heard = 0
    while True:
        lost = None
        try:
            async for notice in client.watch():
                if not os.path.exists("/host/watching"):  # the state when the watch opened
                    record("watching", {"at": time.time()})
                if notice.leave and lost is None:
                    heard += 1
                    lost = "lost-%d" % heard
                    record("heard-%d" % heard, {"at": time.time(), "event_id": notice.event_id,
                           "kind": notice.kind, "source": notice.source})
                    if heard >= ACK_AFTER:
                        # Recorded before the call: the eviction the ack starts may stop this
                        # process before the reply is read.
                        record("acking", {"at": time.time()})
                        record("ack", {"at": time.time(), "reply": await client.acknowledge(1)})
                        await asyncio.Event().wait()
            why = "closed"
        except Exception as exc:
            why = repr(exc)[:300]
        if lost is not None:
            record(lost, {"at": time.time(), "why": why})
        await asyncio.sleep(0.2)
asyncio.run(main())
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


def keep_pod_logs(cluster: Devcluster, folder: Path) -> None:
    """Every container's log in the release's namespace (and the one before a restart), kept
    beside the devcluster's logs: ``down`` removes the node's own copies."""
    core = client.CoreV1Api(cluster.api)
    folder.mkdir(parents=True, exist_ok=True)
    pods = core.list_namespaced_pod(RELEASE_NS).items
    (folder / "pods.json").write_text(
        json.dumps([cluster.api.sanitize_for_serialization(p) for p in pods], indent=1)
    )
    events = core.list_namespaced_event(RELEASE_NS).items
    (folder / "events.txt").write_text(
        "".join(
            f"{e.last_timestamp} {e.involved_object.name} {e.reason}: {e.message}\n" for e in events
        )
    )
    for pod in pods:
        for container in pod.spec.containers:
            for previous in (False, True):
                try:
                    text = core.read_namespaced_pod_log(
                        pod.metadata.name, RELEASE_NS, container=container.name, previous=previous
                    )
                except client.ApiException:
                    continue
                suffix = ".previous" if previous else ""
                name = f"{pod.metadata.name}.{container.name}{suffix}.log"
                (folder / name).write_text(text or "")


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
        keep_pod_logs(real_cluster, handle.run_dir / "logs" / "pods")
        subprocess.run(
            [str(helm), "--kubeconfig", real_cluster.kubeconfig, "--namespace", RELEASE_NS,
             "uninstall", "shoal", "--wait"],
            capture_output=True, timeout=120, check=False,
        )  # fmt: skip
        fakes.close()


def _ready(pod: Any) -> bool:
    return pod.metadata.deletion_timestamp is None and any(
        c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []
    )


def settled(core: Any) -> dict[str, list[Any]]:
    """Waits until the release runs as installed (two scheduler replicas and one agent, all
    Ready, nothing terminating); the pods by program."""

    def ready() -> dict[str, list[Any]] | None:
        pods = core.list_namespaced_pod(RELEASE_NS).items
        by: dict[str, list[Any]] = {"shoal-scheduler": [], "shoal-agent": []}
        for pod in pods:
            if not _ready(pod):
                return None
            by[pod.metadata.labels["app.kubernetes.io/name"]].append(pod)
        counts = {name: len(found) for name, found in by.items()}
        return by if counts == {"shoal-scheduler": 2, "shoal-agent": 1} else None

    return eventually(ready, timeout=180, what="the release's pods all Ready again")


def leader(coordination: Any) -> str:
    """The name of the scheduler pod holding the Lease (its identity is its host name, which
    is the pod's name, and a suffix)."""
    lease = coordination.read_namespaced_lease("shoal-scheduler", RELEASE_NS)
    return str(lease.spec.holder_identity).rsplit("-", 1)[0]


def _gone(core: Any, namespace: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, namespace)
    except client.ApiException as exc:
        return bool(exc.status == 404)
    return False


def _stop(core: Any, pod: Any) -> tuple[float, int | None]:
    """Deletes ``pod`` and follows it with a watch until it is gone: the seconds that took, and
    the exit code its container reported (the kubelet writes it before the pod goes)."""
    namespace, name = pod.metadata.namespace, pod.metadata.name
    listing = core.list_namespaced_pod(namespace, field_selector=f"metadata.name={name}")
    codes: list[int] = []
    asked = time.monotonic()
    core.delete_namespaced_pod(name, namespace)
    took = None
    stream = watch.Watch()
    for event in stream.stream(
        core.list_namespaced_pod,
        namespace,
        field_selector=f"metadata.name={name}",
        resource_version=listing.metadata.resource_version,
        timeout_seconds=int(pod.spec.termination_grace_period_seconds) + 60,
    ):
        seen = event["object"]
        for status in seen.status.container_statuses or []:
            if status.state.terminated is not None:
                codes.append(int(status.state.terminated.exit_code))
        if event["type"] == "DELETED":
            took = time.monotonic() - asked
            stream.stop()
    assert took is not None, f"{name} was not gone after its grace period and a minute"
    return took, (codes[-1] if codes else None)


def test_install_gives_ready_pods_on_the_real_node(
    real_cluster: Devcluster, installed: dict[str, Any]
) -> None:
    core = client.CoreV1Api(real_cluster.api)
    pods = core.list_namespaced_pod(RELEASE_NS).items
    names = sorted(p.metadata.labels["app.kubernetes.io/name"] for p in pods)
    assert names == ["shoal-agent", "shoal-scheduler", "shoal-scheduler"]
    for pod in pods:
        assert pod.spec.node_name == NODE
        assert _ready(pod), pod.metadata.name
    print(f"helm install -> every pod Ready: {installed['install_seconds']:.1f} s")
    aws: HostAwsMetadata = installed["aws"]
    assert any(path.startswith("/latest/meta-data/") for _, path in aws.requests)


@pytest.mark.parametrize("program", ["shoal-scheduler", "shoal-agent"])
def test_each_entry_point_stops_on_sigterm_as_pid_1_within_its_grace(
    real_cluster: Devcluster, installed: dict[str, Any], program: str
) -> None:
    """Deleting the pod sends its PID 1 SIGTERM: it exits 0, well inside its grace period (a
    program that ignored SIGTERM would be killed at its end, exit 137), and its controller's
    replacement becomes Ready through its probes. The scheduler's standby is the one stopped
    here; the leader's stop is the next test's."""
    core = client.CoreV1Api(real_cluster.api)
    pods = settled(core)[program]
    if program == "shoal-scheduler":
        holder = leader(client.CoordinationV1Api(real_cluster.api))
        pods = [p for p in pods if p.metadata.name != holder]
    victim = pods[0]
    grace = victim.spec.termination_grace_period_seconds
    took, code = _stop(core, victim)
    print(f"{program}: delete -> pod gone {took:.2f} s (grace {grace} s), exit code {code}")
    assert code == 0, f"{program} exited {code} on SIGTERM"
    assert took < grace / 2, f"{program} took {took:.1f} s to stop on SIGTERM"
    settled(core)


def plain_pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "shoal-scheduler",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": AGENT_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", "import time; time.sleep(3600)"],
                }
            ],
            **spec,
        },
    }


def test_the_standby_leads_and_binds_within_the_lease_when_the_leader_pod_is_deleted(
    real_cluster: Devcluster, installed: dict[str, Any], real_namespace: str
) -> None:
    core = client.CoreV1Api(real_cluster.api)
    coordination = client.CoordinationV1Api(real_cluster.api)
    schedulers = settled(core)["shoal-scheduler"]
    holder = leader(coordination)
    (old,) = [p for p in schedulers if p.metadata.name == holder]
    (standby,) = [p for p in schedulers if p.metadata.name != holder]
    lease = coordination.read_namespaced_lease("shoal-scheduler", RELEASE_NS)
    bound_by = lease.spec.lease_duration_seconds + 2  # the Lease, and one retry period

    asked = time.monotonic()
    stopped, code = _stop(core, old)
    core.create_namespaced_pod(real_namespace, plain_pod("after-failover"))
    eventually(
        lambda: core.read_namespaced_pod("after-failover", real_namespace).spec.node_name,
        timeout=120,
        what="a pod created after the leader's deletion to be bound",
    )
    took = time.monotonic() - asked
    assert leader(coordination) == standby.metadata.name
    print(
        f"leader deleted -> gone {stopped:.2f} s (exit {code}); "
        f"-> the standby leads and binds a new pod: {took:.2f} s"
    )
    assert code == 0
    assert took < bound_by, f"bound {took:.1f} s after the leader's deletion"
    settled(core)


def worker_pod(name: str, host_dir: Path, *, ack_after: int = 1, **extra: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "metadata": {"name": name, **extra.pop("metadata", {})},
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
                    "image": AGENT_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", WORKER],
                    "env": [{"name": "ACK_AFTER", "value": str(ack_after)}],
                    "securityContext": {
                        "readOnlyRootFilesystem": True,
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [{"name": "host", "mountPath": "/host"}],
                    **extra.pop("container", {}),
                }
            ],
            "volumes": [{"name": "host", "hostPath": {"path": str(host_dir), "type": "Directory"}}],
        },
    }
    return pod


def _folder(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    folder.chmod(0o777)
    return folder


def _record(folder: Path, name: str) -> dict[str, Any] | None:
    path = folder / name
    return json.loads(path.read_text()) if path.is_file() else None


def _running(core: Any, namespace: str, name: str) -> Any:
    pod = eventually(
        lambda: (p := core.read_namespaced_pod(name, namespace)).status.phase == "Running" and p,
        timeout=120,
        what=f"{name} to run on the real node",
    )
    assert pod.spec.node_name == NODE
    assert any(v.name == "shoal-notice" for v in pod.spec.volumes), "the webhook did not wire it"
    return pod


def _watching(folder: Path) -> None:
    """Until the worker's watch is open (the agent sent it the state when it opened). A pod
    that watches nothing yet when a spot notice comes is drained at once, as it should be: it
    cannot be told to checkpoint."""
    eventually(lambda: _record(folder, "watching"), timeout=120, what="the worker to watch")


def _millicores(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def test_the_schedulers_reclaim_reaches_a_worker_container_which_acks_and_is_evicted(
    real_cluster: Devcluster, installed: dict[str, Any], real_namespace: str, tmp_path: Path
) -> None:
    """An elastic gang fills the node's CPU; a higher-priority pod needs one member's room: the
    scheduler writes the reclaim on a surplus member, the agent tells its worker container over
    the socket, the worker acknowledges, the agent evicts it, and the waiting pod binds."""
    core = client.CoreV1Api(real_cluster.api)
    settled(core)
    scheduling = client.SchedulingV1Api(real_cluster.api)
    high = f"shoal-e2e-{real_namespace}"
    scheduling.create_priority_class({"metadata": {"name": high}, "value": 1000})
    try:
        node = core.read_node(NODE)
        used = sum(
            _millicores((c.resources.requests or {}).get("cpu", "0"))
            for p in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}").items
            if p.status.phase not in ("Succeeded", "Failed")
            for c in p.spec.containers
        )
        share = (_millicores(node.status.allocatable["cpu"]) - used - 50) // 2
        assert share >= 200, (node.status.allocatable, used)
        folders = {}
        gang_notes = {names.MIN_MEMBER_ANNOTATION: "1", names.MAX_MEMBER_ANNOTATION: "2"}
        for name in ("member-0", "member-1"):
            folders[name] = _folder(tmp_path, name)
            core.create_namespaced_pod(
                real_namespace,
                worker_pod(
                    name,
                    folders[name],
                    metadata={"labels": {names.GANG_LABEL: "elastic"}, "annotations": gang_notes},
                    container={"resources": {"requests": {"cpu": f"{share}m"}}},
                ),
            )
        for name, folder in folders.items():
            _running(core, real_namespace, name)
            _watching(folder)

        wanting = plain_pod("wanting", priorityClassName=high)
        wanting["spec"]["containers"][0]["resources"] = {"requests": {"cpu": f"{share}m"}}
        asked = time.monotonic()
        asked_at = time.time()
        core.create_namespaced_pod(real_namespace, wanting)

        def told() -> tuple[str, dict[str, Any]] | None:
            for name, folder in folders.items():
                heard = _record(folder, "heard-1")
                if heard is not None:
                    return name, heard
            return None

        victim, heard = eventually(told, timeout=90, what="a member's worker to hear the reclaim")
        assert (heard["source"], heard["kind"]) == ("scheduler", "reclaim"), heard
        eventually(lambda: _record(folders[victim], "acking"), timeout=30, what="the worker's ack")
        eventually(
            lambda: _gone(core, real_namespace, victim),
            timeout=60,
            what=f"the agent to evict {victim} once its worker acknowledged",
        )
        gone_after = time.monotonic() - asked
        eventually(
            lambda: core.read_namespaced_pod("wanting", real_namespace).spec.node_name,
            timeout=60,
            what="the higher-priority pod to bind in the room the victim left",
        )
        bound_after = time.monotonic() - asked
        assert (folders[victim] / "sigterm").is_file(), "the kubelet never delivered SIGTERM"
        survivor = next(n for n in folders if n != victim)
        assert _record(folders[survivor], "heard-1") is None
        assert core.read_namespaced_pod(survivor, real_namespace).status.phase == "Running"
        print(
            f"reclaim: pod created -> victim's worker heard {heard['at'] - asked_at:.2f} s, "
            f"victim gone {gone_after:.2f} s, waiting pod bound {bound_after:.2f} s"
        )
    finally:
        scheduling.delete_priority_class(high)


def test_a_spot_notice_reaches_the_worker_container_again_after_the_agent_container_is_killed(
    real_cluster: Devcluster, installed: dict[str, Any], real_namespace: str, tmp_path: Path
) -> None:
    """A spot notice from the fake AWS at 169.254.169.254 reaches a webhook-wired worker
    container; the agent's container is killed (SIGKILL, through containerd), the kubelet
    restarts it, and the worker, watching again, hears the live notice from the new agent; it
    acknowledges and is evicted with SIGTERM before the deadline. Last in this file: the
    notice drains the node."""
    core = client.CoreV1Api(real_cluster.api)
    agent = settled(core)["shoal-agent"][0]
    folder = _folder(tmp_path, "worker")
    core.create_namespaced_pod(real_namespace, worker_pod("worker", folder, ack_after=2))
    _running(core, real_namespace, "worker")
    _watching(folder)

    aws: HostAwsMetadata = installed["aws"]
    fakes: Threaded = installed["fakes"]
    deadline = datetime.now(UTC) + timedelta(minutes=4)
    noticed = time.time()
    fakes.call(
        lambda: setattr(
            aws,
            "instance_action",
            {"action": "terminate", "time": deadline.strftime("%Y-%m-%dT%H:%M:%SZ")},
        )
    )
    first = eventually(
        lambda: _record(folder, "heard-1"),
        timeout=60,
        what="the worker container to hear the notice "
        f"(the fake's last requests: {aws.requests[-6:]})",
    )
    assert (first["source"], first["kind"]) == ("aws", "terminate"), first
    print(f"notice -> worker container heard: {first['at'] - noticed:.2f} s")

    container = agent.status.container_statuses[0].container_id.split("://", 1)[1]
    socket = real_cluster.handle.real_node(NODE)["containerd_socket"]
    ctr = realnode.ensure(say=lambda _: None).ctr
    killed = time.time()
    subprocess.run(
        [str(ctr), "--address", socket, "--namespace", "k8s.io",
         "tasks", "kill", "--signal", "SIGKILL", container],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    lost = eventually(
        lambda: _record(folder, "lost-1"), timeout=30, what="the worker's watch to end"
    )
    eventually(
        lambda: (
            (p := core.read_namespaced_pod(agent.metadata.name, RELEASE_NS))
            .status.container_statuses[0]
            .restart_count
            >= 1
            and _ready(p)
        ),
        timeout=120,
        what="the kubelet to restart the agent's container and the agent to be Ready",
    )
    again = eventually(
        lambda: _record(folder, "heard-2"),
        timeout=60,
        what="the worker to hear the live notice again from the restarted agent",
    )
    assert again["event_id"] == first["event_id"], again
    print(
        f"agent killed -> worker's watch ended {lost['at'] - killed:.2f} s, "
        f"notice heard again {again['at'] - killed:.2f} s"
    )

    eventually(
        lambda: _gone(core, real_namespace, "worker"),
        timeout=90,
        what="the agent to evict the worker once it acknowledged, and the pod to be gone",
    )
    assert datetime.now(UTC) < deadline
    # The worker acknowledged (its reply may not be recorded: the eviction can stop it first).
    assert _record(folder, "acking") is not None
    assert (folder / "sigterm").is_file(), "the kubelet never delivered SIGTERM"
    node = core.read_node(NODE)
    assert any("shoal" in (t.key or "") for t in node.spec.taints or []), node.spec.taints
