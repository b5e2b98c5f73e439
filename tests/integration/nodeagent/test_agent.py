"""The node agent against the devcluster: a notice in a cloud's metadata server reaches the
node, the pods and the workers; the acknowledging worker is evicted through the Eviction API;
a withdrawn notice lifts the taint; a restart mid-notice loses nothing and repeats nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from kubernetes import client
from shoal_worker import NoticeRefused, PodIdentity

from contracts import gputopology, names
from devcluster import nodes
from fakes import metadata
from fakes import nvml as fake_nvml
from fakes.podresources import FakePodResources
from nodeagent.core.events import parse_rfc3339
from tests.integration.conftest import Devcluster, account_kubeconfig
from tests.integration.nodeagent.harness import (
    CLOUDS,
    AgentProcess,
    Cloud,
    NoCloud,
    Worker,
    disruption_target,
    events,
    eventually,
    release,
    taint,
    worker_pod,
)


@dataclass
class Scene:
    core: Any
    namespace: str
    node: str
    cloud: Cloud
    agent: AgentProcess
    pods: dict[str, PodIdentity]

    def pod(self, name: str) -> Any:
        return self.core.read_namespaced_pod(name, self.namespace)

    def node_object(self) -> Any:
        return self.core.read_node(self.node)

    def worker(self, name: str) -> Worker:
        return Worker(self.pods[name], self.agent.socket_path)


@pytest.fixture
def servers() -> Iterator[metadata.Threaded]:
    threaded = metadata.Threaded()
    yield threaded
    threaded.close()


def make_scene(
    devcluster: Devcluster,
    namespace: str,
    servers: metadata.Threaded,
    tmp_path: Path,
    provider: str,
    *,
    extra: list[str] | None = None,
    env: dict[str, str] | None = None,
    kubeconfig: str | None = None,
) -> Generator[Scene, None, None]:
    core = devcluster.core()
    spec = nodes.NodeSpec(count=1, gpus=8, prefix=f"agent-{provider}-{uuid.uuid4().hex[:6]}")
    (node,) = nodes.create(devcluster.kubeconfig, spec)
    pods: dict[str, PodIdentity] = {}
    for name, is_worker in (("trainer-0", True), ("metrics-sidecar", False)):
        created = core.create_namespaced_pod(namespace, worker_pod(name, node, worker=is_worker))
        pods[name] = PodIdentity(namespace, name, created.metadata.uid)
    cloud = CLOUDS[provider](servers) if provider in CLOUDS else NoCloud(servers)
    agent = AgentProcess(
        kubeconfig=kubeconfig or devcluster.kubeconfig,
        node=node,
        provider=provider,
        metadata_url=cloud.url,
        workdir=tmp_path,
        extra=extra or [],
        env=env or {},
    )
    agent.start()
    try:
        yield Scene(core, namespace, node, cloud, agent, pods)
    finally:
        agent.stop()
        for name in pods:
            release(core, namespace, name)
        core.delete_node(node)


@pytest.fixture(params=sorted(CLOUDS))
def scene(
    request: pytest.FixtureRequest,
    devcluster: Devcluster,
    namespace: str,
    servers: metadata.Threaded,
    tmp_path: Path,
) -> Iterator[Scene]:
    yield from make_scene(devcluster, namespace, servers, tmp_path, request.param)


def revocation(node: Any) -> dict[str, Any] | None:
    text = (node.metadata.annotations or {}).get(names.REVOCATION_ANNOTATION)
    return json.loads(text) if text else None


def test_notice_reaches_node_pods_and_workers_and_the_ack_evicts(scene: Scene) -> None:
    worker = scene.worker("trainer-0")
    try:
        assert worker.next().state == "none"
        scene.cloud.post()

        heard = worker.until("leave")
        assert heard.source == scene.cloud.name
        assert heard.leave_by is not None

        node = eventually(lambda: taint(scene.node_object()) and scene.node_object(), what="taint")
        assert (taint(node).value, taint(node).effect) == (scene.cloud.name, "NoSchedule")
        recorded = revocation(node)
        assert recorded is not None
        assert (recorded["source"], recorded["event_id"]) == (scene.cloud.name, heard.event_id)
        assert parse_rfc3339(recorded["deadline"]) == heard.leave_by

        def annotated() -> Any:
            pod = scene.pod("trainer-0")
            return (pod.metadata.annotations or {}).get(names.LEAVE_BY_ANNOTATION)

        assert parse_rfc3339(eventually(annotated, what="leave-by")) == heard.leave_by
        # The Events are written after the annotation and the taint: wait for them, too.
        eventually(
            lambda: events(scene.core, scene.namespace, "trainer-0", "LeaveBy"), what="LeaveBy"
        )
        eventually(lambda: events(scene.core, "default", scene.node, "Revoking"), what="Revoking")

        assert worker.acknowledge(1200) == "accepted"
        evicted = eventually(
            lambda: disruption_target(scene.pod("trainer-0")) and scene.pod("trainer-0"),
            what="the acknowledging worker's eviction",
        )
        assert evicted.metadata.deletion_timestamp is not None
        assert disruption_target(evicted).reason == "EvictionByEvictionAPI"
        # With the worker gone, the rest of the node drains after it.
        eventually(
            lambda: disruption_target(scene.pod("metrics-sidecar")), what="the sidecar's eviction"
        )
        eventually(scene.cloud.acknowledged, what="the cloud to be acknowledged")
    finally:
        worker.close()

    scene.cloud.withdraw()
    eventually(lambda: taint(scene.node_object()) is None, what="the taint to be lifted")
    assert revocation(scene.node_object()) is None
    eventually(
        lambda: events(scene.core, "default", scene.node, "RevocationWithdrawn"),
        what="RevocationWithdrawn",
    )


@pytest.fixture
def aws_scene(
    devcluster: Devcluster,
    namespace: str,
    servers: metadata.Threaded,
    tmp_path: Path,
) -> Iterator[Scene]:
    yield from make_scene(devcluster, namespace, servers, tmp_path, "aws")


@pytest.mark.reliability
def test_restart_mid_notice_loses_nothing_and_repeats_nothing(aws_scene: Scene) -> None:
    scene = aws_scene
    # A deadline far enough away that the restarted agent finds the notice still live: AWS's
    # two minutes, counted from the scene's start, had passed when a restart beside another test
    # run took a minute, and the agent rightly evicted the pod at once, before the worker watched.
    scene.cloud.renew(timedelta(minutes=10))
    scene.cloud.post()

    def annotated() -> bool:
        pod = scene.pod("trainer-0")
        return names.LEAVE_BY_ANNOTATION in (pod.metadata.annotations or {})

    eventually(annotated, what="the pod's leave-by annotation")
    eventually(lambda: revocation(scene.node_object()), what="the node's revocation annotation")
    # The Events are written after the annotations: the kill comes once all of the first agent's
    # writes are in, so that a second LeaveBy or Revoking could only come from the restart.
    eventually(lambda: events(scene.core, scene.namespace, "trainer-0", "LeaveBy"), what="LeaveBy")
    eventually(lambda: events(scene.core, "default", scene.node, "Revoking"), what="Revoking")
    before = revocation(scene.node_object())
    scene.agent.kill()
    scene.agent.start()

    worker = scene.worker("trainer-0")
    try:
        heard = worker.until("leave")
        assert before is not None
        assert heard.event_id == before["event_id"]
        # The restarted agent found its work done: nothing written twice.
        assert revocation(scene.node_object()) == before
        assert len(events(scene.core, scene.namespace, "trainer-0", "LeaveBy")) == 1
        assert len(events(scene.core, "default", scene.node, "Revoking")) == 1
        assert any(line.get("event") == "notices_restored" for line in scene.agent.log_lines())

        assert worker.acknowledge(7) == "accepted"
        eventually(lambda: disruption_target(scene.pod("trainer-0")), what="the eviction")
    finally:
        worker.close()


@pytest.mark.reliability
def test_acks_are_refused_for_pods_not_under_notice_or_not_on_the_node(aws_scene: Scene) -> None:
    scene = aws_scene
    worker = scene.worker("trainer-0")
    stranger = Worker(
        PodIdentity(scene.namespace, "trainer-0", "00000000-0000-0000-0000-000000000000"),
        scene.agent.socket_path,
    )
    try:
        assert worker.next().state == "none"
        with pytest.raises(NoticeRefused, match="not-under-notice"):
            worker.acknowledge(1)
        with pytest.raises(NoticeRefused):
            stranger.next()
        with pytest.raises(NoticeRefused, match="not-on-node"):
            stranger.acknowledge(1)
    finally:
        worker.close()
        stranger.close()
    assert disruption_target(scene.pod("trainer-0")) is None


@pytest.fixture
def dry_scene(
    devcluster: Devcluster,
    namespace: str,
    servers: metadata.Threaded,
    tmp_path: Path,
) -> Iterator[Scene]:
    yield from make_scene(devcluster, namespace, servers, tmp_path, "alibaba", extra=["--dry-run"])


def test_dry_run_goes_through_every_step_but_writes_nothing(dry_scene: Scene) -> None:
    scene = dry_scene
    worker = scene.worker("trainer-0")
    try:
        worker.next()
        scene.cloud.post()
        worker.until("leave")
        assert worker.acknowledge(3) == "accepted"

        def evicted_in_status() -> bool:
            pods = scene.agent.status()["pods"]
            return any(p["pod"].endswith("/trainer-0") and p["evicted"] for p in pods)

        eventually(evicted_in_status, what="the dry-run eviction")
    finally:
        worker.close()
    assert taint(scene.node_object()) is None
    assert revocation(scene.node_object()) is None
    pod = scene.pod("trainer-0")
    assert names.LEAVE_BY_ANNOTATION not in (pod.metadata.annotations or {})
    assert disruption_target(pod) is None
    assert pod.metadata.deletion_timestamp is None


def test_shell_cli_waits_for_the_notice_and_acknowledges(aws_scene: Scene) -> None:
    scene = aws_scene
    pod = scene.pods["trainer-0"]
    env = {
        **os.environ,
        "POD_NAMESPACE": pod.namespace,
        "POD_NAME": pod.name,
        "POD_UID": pod.uid,
        "SHOAL_SOCKET": scene.agent.socket_path,
    }
    cli = [sys.executable, "-m", "shoal_worker"]
    early = subprocess.run(
        [*cli, "ack", "1"], check=False, env=env, capture_output=True, text=True, timeout=60
    )
    assert early.returncode == 3, early.stderr
    waiting = subprocess.Popen([*cli, "wait"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        scene.cloud.post()
        out, _ = waiting.communicate(timeout=60)
    finally:
        waiting.kill()
    assert waiting.returncode == 0
    notice = json.loads(out)
    assert notice["source"] == "aws"
    ack = subprocess.run(
        [*cli, "ack", "99"], check=False, env=env, capture_output=True, text=True, timeout=60
    )
    assert (ack.returncode, ack.stdout.strip()) == (0, "accepted")
    eventually(lambda: disruption_target(scene.pod("trainer-0")), what="the eviction")


FAKE_UUID = "GPU-fa4e0000-0000-4000-8000-00000000000"


@pytest.fixture
def gpu_scene(
    devcluster: Devcluster,
    namespace: str,
    servers: metadata.Threaded,
    tmp_path: Path,
) -> Iterator[Scene]:
    try:
        libdir = fake_nvml.build(tmp_path / "nvml")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    env = {
        "LD_LIBRARY_PATH": str(libdir),
        "FAKE_NVML_LAYOUT": "islands2x4",
        "FAKE_NVML_XID_FILE": str(tmp_path / "xid"),
    }
    kubelet = FakePodResources(str(tmp_path / "kubelet.sock"))
    # The device plugin's ids are GPU UUIDs: trainer-0 holds GPUs 2 and 3.
    kubelet.pods[f"{namespace}/trainer-0"] = [f"{FAKE_UUID}{i}" for i in (2, 3)]
    servers.run(kubelet.start())
    try:
        extra = ["--pod-resources-socket", kubelet.socket_path]
        yield from make_scene(
            devcluster, namespace, servers, tmp_path, "none", extra=extra, env=env
        )
    finally:
        servers.run(kubelet.close())


def test_gpu_topology_allocation_and_an_xid_fault_reach_the_node_and_the_pod(
    gpu_scene: Scene,
) -> None:
    scene = gpu_scene

    def published() -> gputopology.GpuTopology | None:
        text = (scene.node_object().metadata.annotations or {})[names.GPU_TOPOLOGY_ANNOTATION]
        topology = gputopology.decode(text)
        # The node was created with a synthetic document; the agent's comes from NVML.
        return topology if topology.gpus[0].uuid.startswith("GPU-fa4e") else None

    def allocated() -> gputopology.GpuTopology | None:
        current = published()
        return current if current is not None and current.allocated else None

    topology = eventually(allocated, what="the NVML topology and its allocation on the node")
    assert sorted(sorted(m) for m in topology.islands().values()) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert {g.health for g in topology.gpus} == {"healthy"}
    pod = f"{scene.namespace}/trainer-0"
    assert dict(topology.allocated) == {2: pod, 3: pod}
    assert topology.largest_free_island() == 4

    worker = scene.worker("trainer-0")
    bystander = scene.worker("metrics-sidecar")
    try:
        assert worker.next().state == "none"
        assert bystander.next().state == "none"
        (scene.agent.workdir / "xid").write_text("3 79\n")

        def gpu3_failed() -> gputopology.GpuTopology | None:
            current = published()
            return current if current is not None and current.gpus[3].health == "failed" else None

        faulted = eventually(gpu3_failed, what="XID 79 to mark GPU 3 failed")
        assert [g.health for g in faulted.gpus].count("healthy") == 7

        # GPU 3 belongs to trainer-0: it alone is told to leave; the node stays schedulable.
        heard = worker.until("leave")
        assert (heard.kind, heard.source) == ("gpu-fault", "gpu")
        assert "XID 79" in heard.reason
        assert worker.acknowledge(500) == "accepted"
        eventually(lambda: disruption_target(scene.pod("trainer-0")), what="the eviction")
        assert bystander.notices.empty()
    finally:
        worker.close()
        bystander.close()
    assert taint(scene.node_object()) is None
    assert disruption_target(scene.pod("metrics-sidecar")) is None
    gpu = scene.agent.status()["gpu"]
    assert (gpu["state"], gpu["last_xid"]) == ("ok", {"3": 79})


@pytest.fixture
def cloudless_scene(
    devcluster: Devcluster,
    namespace: str,
    servers: metadata.Threaded,
    tmp_path: Path,
) -> Iterator[Scene]:
    yield from make_scene(devcluster, namespace, servers, tmp_path, "none", extra=["--gpu", "off"])


def test_an_autoscaler_taint_is_a_notice_and_its_removal_a_withdrawal(
    cloudless_scene: Scene,
) -> None:
    scene = cloudless_scene
    worker = scene.worker("trainer-0")
    try:
        assert worker.next().state == "none"
        taints = [t.to_dict() for t in scene.node_object().spec.taints or []]
        added = {
            "key": "ToBeDeletedByClusterAutoscaler",
            "value": "1700000000",
            "effect": "NoSchedule",
        }
        scene.core.patch_node(scene.node, {"spec": {"taints": [*taints, added]}})

        heard = worker.until("leave")
        assert (heard.source, heard.event_id) == (
            "kubernetes",
            "kube-taint-ToBeDeletedByClusterAutoscaler",
        )
        eventually(lambda: taint(scene.node_object()), what="the revoking taint")
        assert taint(scene.node_object()).value == "kubernetes"

        scene.core.patch_node(scene.node, {"spec": {"taints": taints}})
        assert worker.until("withdrawn").state == "withdrawn"
        eventually(lambda: taint(scene.node_object()) is None, what="the revoking taint lifted")
    finally:
        worker.close()
    assert disruption_target(scene.pod("trainer-0")) is None


def test_a_reclaim_on_a_pod_is_its_notice_and_taking_it_back_withdraws_it(
    cloudless_scene: Scene,
) -> None:
    scene = cloudless_scene
    worker = scene.worker("trainer-0")
    bystander = scene.worker("metrics-sidecar")
    leave_by = "2031-01-01T00:00:00Z"
    try:
        assert worker.next().state == "none"
        assert bystander.next().state == "none"
        # The annotations the scheduler writes when it takes the pod back for another gang.
        asked = {names.LEAVE_BY_ANNOTATION: leave_by, names.RECLAIMED_FOR_ANNOTATION: "ml/big"}
        scene.core.patch_namespaced_pod(
            "trainer-0", scene.namespace, {"metadata": {"annotations": asked}}
        )

        heard = worker.until("leave")
        assert (heard.source, heard.kind) == ("scheduler", "reclaim")
        assert heard.leave_by == parse_rfc3339(leave_by)
        assert "ml/big" in heard.reason

        taken_back = {k: None for k in asked}
        scene.core.patch_namespaced_pod(
            "trainer-0", scene.namespace, {"metadata": {"annotations": taken_back}}
        )
        assert worker.until("withdrawn").state == "withdrawn"
        assert bystander.notices.empty()  # the reclaim was that pod's alone
    finally:
        worker.close()
        bystander.close()
    # The scheduler's notice: the agent touched neither the node nor the pod's annotations.
    assert taint(scene.node_object()) is None
    notes = scene.pod("trainer-0").metadata.annotations or {}
    assert names.LEAVE_REASON_ANNOTATION not in notes
    assert not events(scene.core, scene.namespace, "trainer-0", "LeaveBy")
    assert disruption_target(scene.pod("trainer-0")) is None


def test_readyz_reports_a_failing_metadata_server_and_the_agent_survives_it(
    aws_scene: Scene,
) -> None:
    scene = aws_scene
    servers = scene.cloud.servers
    server = scene.cloud.server
    servers.call(lambda: server.faults.next(*["503"] * 5000))

    def unready() -> dict[str, Any] | None:
        status, body = scene.agent.get("/readyz")
        return body if status == 503 else None

    body = eventually(unready, what="/readyz to report the metadata failures")
    assert "HTTP 503" in body["metadata"]["aws/spot"]
    assert scene.agent.get("/healthz")[0] == 200
    assert 'shoal_agent_metadata_errors_total{channel="aws/spot",kind="status"}' in (
        scene.agent.metrics()
    )

    servers.call(server.faults.queue.clear)
    eventually(scene.agent.ready, what="/readyz to recover")
    # A notice after the outage is still seen.
    scene.cloud.post()
    eventually(lambda: taint(scene.node_object()), what="the taint after the outage")


@pytest.fixture
def gcp_scene(
    devcluster: Devcluster,
    namespace: str,
    servers: metadata.Threaded,
    tmp_path: Path,
) -> Iterator[Scene]:
    margins = ["--evict-margin", "20", "--delete-margin", "8", "--gpu", "off"]
    yield from make_scene(devcluster, namespace, servers, tmp_path, "gcp", extra=margins)


def test_a_pdb_that_refuses_eviction_ends_in_a_delete_before_the_deadline(
    gcp_scene: Scene, devcluster: Devcluster
) -> None:
    scene = gcp_scene
    policy = client.PolicyV1Api(devcluster.api)
    policy.create_namespaced_pod_disruption_budget(
        scene.namespace,
        {
            "metadata": {"name": "keep-trainers"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {names.GANG_LABEL: "trainer"}}},
        },
    )

    def budget_computed() -> bool:
        pdb = policy.read_namespaced_pod_disruption_budget("keep-trainers", scene.namespace)
        return pdb.status is not None and pdb.status.expected_pods == 1

    eventually(budget_computed, what="the disruption controller to compute the budget")
    worker = scene.worker("trainer-0")
    try:
        worker.next()
        scene.cloud.post()
        heard = worker.until("leave")
        assert worker.acknowledge(1) == "accepted"
        assert heard.leave_by is not None

        def deleted() -> Any:
            pod = scene.pod("trainer-0")
            return pod if pod.metadata.deletion_timestamp is not None else None

        pod = eventually(deleted, timeout=60, what="the last-resort delete")
    finally:
        worker.close()
    # The budget held the eviction back (no DisruptionTarget from the Eviction API); the delete
    # came in the last seconds before the deadline, with the short grace period.
    assert disruption_target(pod) is None
    lines = [line for line in scene.agent.log_lines() if line.get("pod", "").endswith("trainer-0")]
    assert any(line["event"] == "eviction_refused" for line in lines)
    (deleted_line,) = [line for line in lines if line["event"] == "pod_deleted"]
    assert deleted_line["grace_seconds"] == 3
    assert parse_rfc3339(deleted_line["timestamp"]) <= heard.leave_by


class Receiver:
    """A webhook endpoint that keeps what it was sent."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        async def hook(request: web.Request) -> web.Response:
            self.received.append(await request.json())
            return web.Response(status=204)

        app = web.Application()
        app.router.add_post("/hook", hook)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}/hook"

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def test_the_webhook_fires_when_the_notice_arrives_and_when_the_node_has_drained(
    devcluster: Devcluster, namespace: str, servers: metadata.Threaded, tmp_path: Path
) -> None:
    receiver = Receiver()
    servers.run(receiver.start())
    extra = ["--webhook-url", receiver.url, "--gpu", "off"]
    scenes = make_scene(devcluster, namespace, servers, tmp_path, "alibaba", extra=extra)
    scene = next(scenes)
    try:
        worker = scene.worker("trainer-0")
        try:
            worker.next()
            scene.cloud.post()
            worker.until("leave")
            first = eventually(lambda: servers.call(lambda: list(receiver.received)), what="hook")
            # Sent on arrival: before any pod was evicted.
            assert first[0]["kind"] == "notice"
            assert disruption_target(scene.pod("trainer-0")) is None
            worker.acknowledge(4)
        finally:
            worker.close()

        def drained() -> list[dict[str, Any]] | None:
            got = servers.call(lambda: list(receiver.received))
            return got if any(m["kind"] == "drained" for m in got) else None

        messages = eventually(drained, what="the drained hook")
        assert [m["kind"] for m in messages] == ["notice", "drained"]
        assert messages[0]["event_id"] == messages[1]["event_id"]
        assert messages[1]["node"] == scene.node
    finally:
        scenes.close()
        servers.run(receiver.close())


@pytest.fixture
def azure_scene(
    devcluster: Devcluster, namespace: str, servers: metadata.Threaded, tmp_path: Path
) -> Iterator[Scene]:
    yield from make_scene(devcluster, namespace, servers, tmp_path, "azure", extra=["--gpu", "off"])


@pytest.mark.reliability
def test_restart_after_the_azure_ack_does_not_acknowledge_twice(azure_scene: Scene) -> None:
    scene = azure_scene
    server = scene.cloud.server
    servers = scene.cloud.servers

    def start_requests() -> int:
        seen: list[tuple[str, str]] = servers.call(lambda: list(server.requests))
        return seen.count(("POST", "/metadata/scheduledevents"))

    worker = scene.worker("trainer-0")
    try:
        worker.next()
        scene.cloud.post()
        worker.until("leave")
        worker.acknowledge(11)
    finally:
        worker.close()
    eventually(scene.cloud.acknowledged, what="StartRequests")
    recorded = eventually(
        lambda: (
            (revocation(scene.node_object()) or {}).get("notices", [{}])[0].get("upstream_acked")
        ),
        what="the ack recorded on the node",
    )
    assert recorded is True
    assert start_requests() == 1

    scene.agent.kill()
    scene.agent.start()
    eventually(lambda: scene.agent.status()["reconciles"] >= 3, what="the restarted agent at work")
    (notice,) = scene.agent.status()["notices"]
    assert notice["upstream_acked"] is True
    assert start_requests() == 1
    assert taint(scene.node_object()) is not None


@pytest.fixture
def warned_scene(
    devcluster: Devcluster, namespace: str, servers: metadata.Threaded, tmp_path: Path
) -> Iterator[Scene]:
    extra = ["--gpu", "off", "--kube-event-reasons", "PreRelease"]
    yield from make_scene(devcluster, namespace, servers, tmp_path, "none", extra=extra)


def test_a_platform_event_on_a_pod_is_a_notice_for_that_pod(warned_scene: Scene) -> None:
    scene = warned_scene
    worker = scene.worker("trainer-0")
    bystander = scene.worker("metrics-sidecar")
    try:
        assert worker.next().state == "none"
        assert bystander.next().state == "none"
        pod = scene.pods["trainer-0"]
        scene.core.create_namespaced_event(
            scene.namespace,
            {
                "metadata": {"generateName": "trainer-0."},
                "involvedObject": {
                    "kind": "Pod",
                    "apiVersion": "v1",
                    "namespace": pod.namespace,
                    "name": pod.name,
                    "uid": pod.uid,
                },
                "reason": "PreRelease",
                "message": "the instance will be released in 5 minutes",
                "type": "Warning",
                "source": {"component": "AcsService"},
            },
        )
        heard = worker.until("leave")
        assert heard.source == "kubernetes"
        assert "PreRelease" in heard.reason
        assert worker.acknowledge(3) == "accepted"
        eventually(lambda: disruption_target(scene.pod("trainer-0")), what="the eviction")
        assert bystander.notices.empty()
    finally:
        worker.close()
        bystander.close()
    assert taint(scene.node_object()) is None


def _installed_agent_rules() -> list[dict[str, Any]]:
    """The rules of the ClusterRole that manifests/ installs for the agent, so this test proves
    the shipped RBAC (not a copy of it) is enough."""
    path = Path(__file__).resolve().parents[3] / "manifests" / "agent" / "rbac.yaml"
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc["kind"] == "ClusterRole" and doc["metadata"]["name"] == "shoal-agent":
            return list(doc["rules"])
    raise AssertionError(f"no shoal-agent ClusterRole in {path}")


#: What the agent needs from the API server, and nothing more (the DaemonSet's ClusterRole).
AGENT_RULES = _installed_agent_rules()


@pytest.fixture
def least_privilege_kubeconfig(
    devcluster: Devcluster, namespace: str, tmp_path: Path
) -> Iterator[str]:
    """A service account bound to AGENT_RULES only, as a token kubeconfig."""
    with account_kubeconfig(
        devcluster,
        namespace,
        "nodeagent",
        AGENT_RULES,
        tmp_path / "agent.kubeconfig",
        role=f"shoal-nodeagent-{namespace}",
    ) as path:
        yield path


def test_the_agent_works_with_a_token_and_only_its_documented_rbac(
    devcluster: Devcluster,
    namespace: str,
    servers: metadata.Threaded,
    tmp_path: Path,
    least_privilege_kubeconfig: str,
) -> None:
    scenes = make_scene(
        devcluster,
        namespace,
        servers,
        tmp_path,
        "aws",
        extra=["--gpu", "off"],
        kubeconfig=least_privilege_kubeconfig,
    )
    scene = next(scenes)
    try:
        worker = scene.worker("trainer-0")
        try:
            worker.next()
            scene.cloud.post()
            worker.until("leave")
            assert worker.acknowledge(8) == "accepted"
            eventually(lambda: disruption_target(scene.pod("trainer-0")), what="the eviction")
        finally:
            worker.close()
        assert taint(scene.node_object()) is not None
        eventually(
            lambda: events(scene.core, scene.namespace, "trainer-0", "LeaveBy"), what="LeaveBy"
        )
        refused = [
            line
            for line in scene.agent.log_lines()
            if line.get("event")
            in ("action_failed", "event_not_recorded", "pods_unreadable", "pod_watch_failed")
        ]
        assert refused == []
    finally:
        scenes.close()
