"""API server trouble on a control plane of the module's own: kube-apiserver and etcd restarted
while gangs are being created, watches that expire (410 Gone) and resume, etcd frozen so that
requests time out. The scheduler and the node agent run through all of it as one process each,
and afterwards every gang is bound whole, once, without over-committing a GPU."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from devcluster import cluster, nodes
from fakes import metadata
from fakes.clouds import Aws
from nodeagent.client import LeaveNotice, PodIdentity
from tests import figures
from tests.integration.conftest import Devcluster
from tests.integration.nodeagent.harness import AgentProcess, Worker, release, taint, worker_pod
from tests.integration.reliability.owncluster import (
    GangMaker,
    check_bindings,
    events,
    gangs_whole,
    metrics,
    own_devcluster,
)
from tests.integration.scheduler.conftest import Pods, Pool, SchedulerProcess
from tests.waiting import eventually

pytestmark = pytest.mark.reliability

SECTION = "api server trouble"
GPUS = 8


@pytest.fixture(scope="module")
def devcluster(tmp_path_factory: pytest.TempPathFactory, bin_dir: Path) -> Iterator[Devcluster]:
    """This module's own control plane: its components are restarted and frozen here."""
    options = cluster.Options(die_with_parent=True)
    yield from own_devcluster(tmp_path_factory.mktemp("apiserver-trouble"), bin_dir, options)


def restart(devcluster: Devcluster, name: str, stopped: Callable[[], None] | None = None) -> float:
    """Restart a component; ``stopped`` is called once it has been stopped."""
    started = time.monotonic()

    def say(line: str) -> None:
        print(line)
        if stopped is not None and "restarting" in line:
            stopped()

    cluster.restart(devcluster.handle, name, say=say)
    return time.monotonic() - started


def made_more(maker: GangMaker, count: int, what: str) -> None:
    """Wait until ``maker`` has finished ``count`` more gangs. Its thread makes one gang at a
    time and enters the next before creating its pods, so a gang is finished once the one after
    it is under way."""
    target = len(maker.made) + count + 1
    eventually(lambda: len(maker.made) >= target, timeout=120, what=what)


def test_restarts_under_load_lose_nothing_and_bind_nothing_twice(
    devcluster: Devcluster,
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    tmp_path: Path,
) -> None:
    pool.add(16, gpus=GPUS)  # 128 GPUs; at most 40 gangs of 3 are made
    scheduler = start_scheduler()
    pid = scheduler.proc.pid if scheduler.proc else 0

    # The node agent on a node of its own, with a worker pod, behind a fake AWS metadata server.
    servers = metadata.Threaded()
    cloud = Aws(servers)
    core = devcluster.core()
    (agent_node,) = nodes.create(
        devcluster.kubeconfig, nodes.NodeSpec(count=1, prefix=f"agent-{uuid.uuid4().hex[:4]}")
    )
    trainer = core.create_namespaced_pod(pods.namespace, worker_pod("trainer-0", agent_node))
    agent = AgentProcess(
        kubeconfig=devcluster.kubeconfig,
        node=agent_node,
        provider="aws",
        metadata_url=cloud.url,
        workdir=tmp_path,
    )
    agent.start()
    maker = GangMaker(pods, size=3, interval=0.5, limit=37)
    try:
        for _ in range(4):
            maker.one()
        maker.start()
        made_more(maker, 3, "gangs made before the restarts")

        # kube-apiserver restarted while gangs are being created.
        maker.phase = "during"
        recovery = [restart(devcluster, "kube-apiserver")]
        made_more(maker, 3, "gangs made after the API server's restart")
        # etcd restarted under the running API server (its watches to etcd break and resume).
        recovery.append(restart(devcluster, "etcd"))
        made_more(maker, 3, "gangs made after etcd's restart")
        # Both, one after the other, as an upgrade of a single control-plane node does.
        recovery.append(restart(devcluster, "etcd"))
        recovery.append(restart(devcluster, "kube-apiserver"))
        maker.phase = "after"
        restarted_at = time.monotonic()
        made_more(maker, 3, "gangs made after the last restarts")
        maker.stop()
        for _ in range(3):
            maker.one()

        # The agent still works: a notice posted now reaches the node and the worker.
        worker = Worker(
            PodIdentity(pods.namespace, "trainer-0", trainer.metadata.uid), agent.socket_path
        )
        try:
            cloud.post()
            heard = worker.until("leave", timeout=60)
            assert heard.source == "aws"
        finally:
            worker.close()
        eventually(lambda: taint(core.read_node(agent_node)), what="the revoking taint")

        every_pod = [m for _, members in maker.made.values() for m in members]

        def all_bound() -> bool:
            return len(pods.bound(every_pod)) == len(every_pod)

        eventually(all_bound, timeout=120, what="every gang to be bound after the restarts")
        recovered_in = time.monotonic() - restarted_at
        bound = check_bindings(devcluster, pods.namespace, GPUS)
        assert sorted(gangs_whole(maker.made, bound)) == sorted(maker.made)

        # One process throughout, and each pod bound by exactly one successful binding.
        assert scheduler.proc is not None
        assert scheduler.proc.poll() is None
        assert agent.proc is not None
        assert agent.proc.poll() is None
        assert len(events(scheduler, "started")) == 1
        seen = metrics(scheduler)
        assert seen['shoal_scheduler_binds_total{result="ok"}'] == len(every_pod)
        listed = events(scheduler, "informer_listed")
        relists = len(listed) - len({e["kind"] for e in listed})
        expired = events(scheduler, "watch_expired_relisting")
        errors = events(scheduler, "informer_error")
        # Each informer listed once at start; the restarts made them list again (410 Gone).
        assert relists > 0, "no informer listed again after the API server came back"

        figures.record(SECTION, "restarts done", len(recovery))
        figures.record(SECTION, "restart seconds (max)", round(max(recovery), 2))
        figures.record(SECTION, "gangs created before/during/after", maker.by_phase())
        figures.record(SECTION, "pods bound", len(every_pod))
        figures.record(SECTION, "create retries while down", maker.errors)
        figures.record(SECTION, "watch re-lists seen (410)", len(expired))
        figures.record(SECTION, "informer re-lists", relists)
        figures.record(SECTION, "informer errors retried", len(errors))
        figures.record(SECTION, "seconds to bind all after last restart", round(recovered_in, 1))
        figures.record(SECTION, "scheduler pid unchanged", scheduler.proc.pid == pid)
    finally:
        maker.stop()
        agent.stop()
        servers.close()
        release(core, pods.namespace, "trainer-0")


def test_a_taint_written_while_the_agent_watch_is_broken_reaches_the_worker(
    devcluster: Devcluster, namespace: str, tmp_path: Path
) -> None:
    """The agent watches its Node; restarting kube-apiserver breaks that watch. A taint that
    appears the moment the API server is back, before the agent has watched again, is still a
    notice: the agent resumes its watch from where it broke, or lists again when that version
    is too old. The worker is to be told within 2 s of the API server's return."""
    core = devcluster.core()
    (node,) = nodes.create(
        devcluster.kubeconfig, nodes.NodeSpec(count=1, prefix=f"taint-{uuid.uuid4().hex[:4]}")
    )

    # After the restarts above, kube-controller-manager may take a while to give the new
    # namespace its default service account, without which no pod is admitted.
    def default_account() -> bool:
        accounts = core.list_namespaced_service_account(namespace).items
        return any(a.metadata.name == "default" for a in accounts)

    eventually(default_account, timeout=120, what="the namespace's default service account")
    trainer = core.create_namespaced_pod(namespace, worker_pod("trainer-0", node))
    agent = AgentProcess(
        kubeconfig=devcluster.kubeconfig,
        node=node,
        provider="none",
        metadata_url="http://127.0.0.1:9",
        workdir=tmp_path,
        extra=["--gpu", "off"],
    )
    agent.start()
    worker = Worker(PodIdentity(namespace, "trainer-0", trainer.metadata.uid), agent.socket_path)
    try:
        assert worker.next().state == "none"
        taints = [t.to_dict() for t in core.read_node(node).spec.taints or []]
        autoscaler = {"key": "ToBeDeletedByClusterAutoscaler", "value": "1", "effect": "NoSchedule"}

        # The taint is written the moment the restarted API server takes a write, while the
        # agent's node watch is broken (it retries within a second).
        written: list[tuple[float, float]] = []  # the write's start and its answer

        def write_taint() -> None:
            body = {"spec": {"taints": [*taints, autoscaler]}}
            while not written:
                attempt = time.monotonic()
                try:
                    core.patch_node(node, body, _request_timeout=2)
                except Exception:  # the API server is down: try again at once
                    time.sleep(0.02)
                else:
                    written.append((attempt, time.monotonic()))

        heard: list[tuple[LeaveNotice, float]] = []

        def listen() -> None:
            notice = worker.until("leave", timeout=120)
            heard.append((notice, time.monotonic()))

        writer = threading.Thread(target=write_taint, daemon=True)
        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        # From this thread: the restarted process dies with the thread that started it.
        restart(devcluster, "kube-apiserver", writer.start)
        writer.join(timeout=30)
        listener.join(timeout=120)
        assert written, "the taint was never written"
        assert heard, "the worker was not told"
        [(notice, heard_at)] = heard
        # The API server is back once it has answered the taint's write (the write itself may
        # wait while it starts); the agent may see the taint before the writer hears back.
        (write_started, answered) = written[0]
        heard_in = max(0.0, heard_at - answered)

        assert (notice.source, notice.event_id) == (
            "kubernetes",
            "kube-taint-ToBeDeletedByClusterAutoscaler",
        )
        broke = [
            line
            for line in agent.log_lines()
            if line.get("event") in ("node_watch_failed", "node_watch_expired_relisting")
        ]
        assert broke, "the agent's node watch did not notice the restart"
        print(*(f"agent: {line.get('event')} {line.get('error', '')}" for line in broke), sep="\n")
        eventually(lambda: taint(core.read_node(node)), what="the revoking taint")
        print(
            f"the taint's write took {answered - write_started:.3f} s as the API server came "
            f"back; the worker was told {heard_at - answered:+.3f} s from its answer"
        )
        figures.record(
            SECTION, "seconds from API server back to a new taint heard", round(heard_in, 3)
        )
        # What is asked of the agent: the worker told within 2 s of the API server's return.
        assert heard_in <= 2.0, f"heard {heard_in:.2f} s after the API server's return"
    finally:
        worker.close()
        agent.stop()
        release(core, namespace, "trainer-0")
        core.delete_node(node)


def service_account_kubeconfig(devcluster: Devcluster, namespace: str, path: Path) -> str:
    """A token kubeconfig for a service account with cluster-admin rights.

    The admin certificate is in ``system:masters``, which the API server never throttles; a
    scheduler deployed in a cluster runs as a service account, which it does.
    """
    core = devcluster.core()
    rbac = client.RbacAuthorizationV1Api(devcluster.api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "scheduler"}})
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": f"shoal-scheduler-{namespace}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "scheduler", "namespace": namespace}],
        }
    )
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    )
    token = core.create_namespaced_service_account_token("scheduler", namespace, request)
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "sa",
        "contexts": [{"name": "sa", "context": {"cluster": "dev", "user": "sa"}}],
        "clusters": [
            {
                "name": "dev",
                "cluster": {
                    "server": devcluster.handle.server,
                    "certificate-authority": str(devcluster.handle.ca_cert),
                },
            }
        ],
        "users": [{"name": "sa", "user": {"token": token.status.token}}],
    }
    path.write_text(json.dumps(doc))
    return str(path)


def throttled(scheduler: SchedulerProcess) -> int:
    """Answers ``429 Too Many Requests`` the scheduler got, from its own log."""
    count = 0
    for line in scheduler.log_lines():
        if line.get("status") == 429 or "429 Too Many Requests" in str(line.get("error", "")):
            count += 1
    return count


THROTTLE = (
    "--enable-priority-and-fairness=false",
    "--max-requests-inflight=1",
    "--max-mutating-requests-inflight=1",
)


def test_throttling_and_a_frozen_etcd_slow_the_scheduler_down_but_lose_nothing(
    devcluster: Devcluster, pool: Pool, pods: Pods, scheduler_name: str, tmp_path: Path
) -> None:
    pool.add(10, gpus=GPUS)  # 80 GPUs; 24 gangs of 3 are made
    kubeconfig = service_account_kubeconfig(devcluster, pods.namespace, tmp_path / "sa.kubeconfig")
    scheduler = SchedulerProcess(kubeconfig, scheduler_name, tmp_path).start()
    handle = devcluster.handle
    apiserver = next(p for p in handle.procs if p.name == "kube-apiserver")
    etcd = next(p for p in handle.procs if p.name == "etcd")
    normal = list(apiserver.argv)
    maker = GangMaker(pods, size=3, interval=0.3, limit=16)
    try:
        # The API server allows one request at a time (one mutating): the rest get 429.
        cluster.restart(handle, "kube-apiserver", argv=[*normal, *THROTTLE])
        maker.start()
        made_more(maker, 6, "gangs made through the throttled API server")
        eventually(
            lambda: throttled(scheduler) > 0,
            timeout=60,
            what="the throttled API server to turn the scheduler away (429)",
        )

        # etcd stops answering for a while: every request the API server takes in waits on it
        # (the scheduler's requests time out on its side or the server's), then all resume.
        os.killpg(etcd.pid, signal.SIGSTOP)
        stalled = time.monotonic()
        try:
            time.sleep(10)
        finally:
            os.killpg(etcd.pid, signal.SIGCONT)
        frozen = time.monotonic() - stalled
        maker.stop()
        cluster.restart(handle, "kube-apiserver", argv=normal)
        for _ in range(8):
            maker.one()

        every_pod = [m for _, members in maker.made.values() for m in members]
        eventually(
            lambda: len(pods.bound(every_pod)) == len(every_pod),
            timeout=120,
            what="every gang to be bound after the throttling and the stall",
        )
        bound = check_bindings(devcluster, pods.namespace, GPUS)
        assert sorted(gangs_whole(maker.made, bound)) == sorted(maker.made)
        assert scheduler.proc is not None
        assert scheduler.proc.poll() is None
        assert len(events(scheduler, "started")) == 1
        seen = metrics(scheduler)
        assert seen['shoal_scheduler_binds_total{result="ok"}'] == len(every_pod)

        failed = events(scheduler, "bind_failed")
        rejected = throttled(scheduler)
        figures.record(SECTION, "429s the scheduler got", rejected)
        figures.record(SECTION, "binds failed and retried", len(failed))
        figures.record(SECTION, "seconds etcd was frozen", round(frozen, 1))
        figures.record(SECTION, "gangs bound after throttling", len(maker.made))
        assert rejected > 0, "the throttled API server turned nothing away"
    finally:
        maker.stop()
        os.killpg(etcd.pid, signal.SIGCONT)
        scheduler.stop()
