"""Real elastic torchrun training in pods on the devcluster: the real scheduler places a gang
(minimum 2, maximum 3) wired by its admission webhook, each kwok node has a real agent (its own
fake AWS metadata server and socket folder), and :mod:`fakes.runtime` runs each pod's command as
real processes. A spot notice on one node, or the scheduler reclaiming a member for a
higher-priority pod, stops every rank at one step, the leaving pod is evicted once it
acknowledged the complete checkpoint, and the two pods left resume at the next step with the
losses of a run that never stopped."""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from shoal_worker.distributed import latest_checkpoint

from contracts import names
from fakes import metadata
from fakes.clouds import Aws
from fakes.runtime import Runtime
from tests import figures, waiting
from tests.integration.history import History
from tests.integration.nodeagent.harness import AgentProcess, eventually
from tests.integration.scheduler.conftest import (
    KWOK_TOLERATION,
    TEST_LABEL,
    Pool,
    ensure_priority_class,
)
from tests.integration.scheduler.test_webhook import Webhook
from tests.unit.worker.torchjob import ROOT, Job, rendezvous_store

pytestmark = pytest.mark.timeout(waiting.TRAINING_TIMEOUT)

SECTION = "torchrun pods"
PODS = ["train-0", "train-1", "train-2"]
LEAVER = "train-0"
HIGH = "shoal-test-high"
#: A hang detector for each wait on the pods' training (three torch processes start and meet,
#: a notice reaches them, they leave): a minute on a quiet machine, past 180 s beside another run.
SLOW = 600


@pytest.fixture
def servers() -> Iterator[metadata.Threaded]:
    threaded = metadata.Threaded()
    yield threaded
    threaded.close()


@pytest.fixture
def runtime_root() -> Iterator[Path]:
    """Short, for the sockets' paths (a unix socket's path has at most 107 bytes)."""
    root = Path(tempfile.mkdtemp(prefix="shoal-rt-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def member_annotations() -> dict[str, str]:
    """Annotations of every gang member besides the gang's own (a test may parametrize it)."""
    return {}


def trainer_pod(
    name: str,
    webhook: Webhook,
    pool: Pool,
    job: Job,
    port: int,
    *,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A gang member whose command is torchrun with the settings ``docs/workers.md`` lists;
    the webhook adds the socket, the pod's identity and the leave-by file."""
    rdzv = "is_host=false,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=5"
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1:3",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=pods",
        f"--rdzv-conf={rdzv}",
        f"--max-restarts={job.max_restarts}",
        "--monitor-interval=0.1",
    ]
    env = {
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "LOGLEVEL": "WARNING",
    }
    return webhook.pod(
        name,
        labels={names.GANG_LABEL: "pods"},
        annotations={
            names.MIN_MEMBER_ANNOTATION: "2",
            names.MAX_MEMBER_ANNOTATION: "3",
            **(annotations or {}),
        },
        spec={
            "tolerations": [KWOK_TOLERATION],
            "nodeSelector": {TEST_LABEL: pool.pool},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.example.com/train:1",
                    "command": torchrun,
                    "args": job.trainer_args(),
                    "env": [{"name": k, "value": v} for k, v in env.items()],
                    "resources": {"limits": {names.GPU_RESOURCE: "8"}},
                }
            ],
        },
    )


@dataclass
class Scene:
    """Three nodes, each with its agent and metadata server; the gang training on them."""

    core: Any
    namespace: str
    job: Job
    runtime: Runtime
    clouds: dict[str, Aws]
    agents: dict[str, AgentProcess]
    placed: dict[str, str] = field(default_factory=dict)

    def agent_of(self, pod: str) -> AgentProcess:
        return self.agents[self.placed[pod]]


@pytest.fixture
def scene(
    pool: Pool,
    webhook: Webhook,
    servers: metadata.Threaded,
    runtime_root: Path,
    tmp_path: Path,
    *,
    member_annotations: dict[str, str],
) -> Iterator[Scene]:
    devcluster = pool.devcluster
    # Only the eviction stops the leaving torchrun. 300 steps, about 25 s of training: with the
    # default 40 (4 s), on a machine loaded by another run, the job had ended by the time the
    # scheduler's reclaim reached it, and no rank was left to stop.
    job = Job(tmp_path, steps=300, eviction_wait=600.0)
    store = rendezvous_store()  # as on a node that is not revoked
    made = pool.add(3, gpus=8)
    runtime = Runtime(
        devcluster.kubeconfig,
        webhook.namespace,
        made,
        runtime_root,
        selector=f"{names.GANG_LABEL}=pods",
    ).start()
    clouds = {node: Aws(servers) for node in made}
    agents = {
        node: AgentProcess(
            kubeconfig=devcluster.kubeconfig,
            node=node,
            provider="aws",
            metadata_url=clouds[node].url,
            workdir=runtime.layout.host_path(node, "/run/shoal"),
        )
        for node in made
    }
    scene = Scene(devcluster.core(), webhook.namespace, job, runtime, clouds, agents)
    try:
        for agent in agents.values():
            agent.workdir.mkdir(parents=True)
            agent.start()
        for name in PODS:
            body = trainer_pod(name, webhook, pool, job, store.port, annotations=member_annotations)
            scene.core.create_namespaced_pod(scene.namespace, body)
        scene.placed = eventually(
            lambda: _bound(scene.core, scene.namespace), timeout=SLOW, what="the gang bound"
        )
        eventually(
            lambda: [r for r in job.records("step") if r["world"] == 3 and r["step"] >= 3],
            timeout=SLOW,
            what=f"the three pods to train together ({runtime_root})",
        )
        yield scene
    finally:
        runtime.close()
        for agent in agents.values():
            agent.stop()


def test_a_spot_notice_stops_every_rank_at_one_step_and_two_pods_resume(scene: Scene) -> None:
    posted = time.time()
    scene.clouds[scene.placed[LEAVER]].post()
    stopped, resumed = left_and_resumed(scene, LEAVER)
    figures.record(SECTION, "spot notice posted to every rank stopped (s)", stopped - posted)
    figures.record(SECTION, "last stop to first resumed step (s)", resumed - stopped)


def test_a_reclaim_heard_on_the_socket_stops_every_rank_and_two_pods_resume(
    scene: Scene, pool: Pool, webhook: Webhook, pod_history: History
) -> None:
    ensure_priority_class(pool.devcluster, HIGH, 100000)
    asked = time.time()
    urgent = webhook.pod(
        "urgent",
        labels={names.GANG_LABEL: "urgent"},
        spec={
            "priorityClassName": HIGH,
            "tolerations": [KWOK_TOLERATION],
            "nodeSelector": {TEST_LABEL: pool.pool},
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.example.com/train:1",
                    "resources": {"limits": {names.GPU_RESOURCE: "8"}},
                }
            ],
        },
    )
    scene.core.create_namespaced_pod(scene.namespace, urgent)
    victim = eventually(lambda: _reclaimed(scene), timeout=SLOW, what="a member reclaimed")

    stopped, resumed = left_and_resumed(scene, victim)
    # The scheduler asked through the victim's annotations (what its agent turned into the
    # notice); read from every version of the pod, for they go with the pod.
    annotated = pod_history.when(victim, lambda pod: _leave_by(pod) is not None)
    assert annotated is not None, f"{victim} never carried {names.LEAVE_BY_ANNOTATION}"
    [notes] = {
        (pod.metadata.annotations or {}).get(names.RECLAIMED_FOR_ANNOTATION)
        for pod in pod_history.versions(victim)
        if _leave_by(pod) is not None
    }
    assert notes == f"{scene.namespace}/urgent"
    evicting = eventually(
        lambda: pod_history.when(victim, lambda pod: pod.metadata.deletion_timestamp is not None),
        timeout=SLOW,
        what="the pod watch to see the eviction",
    )
    assert evicting >= annotated
    # The window a poll of the annotation had to land in.
    figures.record(
        SECTION,
        "reclaim: leave-by written to the victim evicted (s)",
        round(evicting - annotated, 3),
    )
    # The worker was told on the socket before it acknowledged (the agent times the ack from
    # then), not only by the leave-by file.
    metrics = scene.agent_of(victim).metrics()
    assert "shoal_agent_time_to_ack_seconds_count 1.0" in metrics
    eventually(
        lambda: scene.core.read_namespaced_pod("urgent", scene.namespace).spec.node_name,
        timeout=SLOW,
        what="the urgent gang bound in the room it made",
    )
    figures.record(
        SECTION, "higher-priority pod created to every rank stopped (s)", stopped - asked
    )
    figures.record(SECTION, "last stop to first resumed step (s), reclaim", resumed - stopped)


@pytest.mark.parametrize(
    "member_annotations", [{names.CHECKPOINT_SECONDS_ANNOTATION: "3600"}], ids=["hour-long"]
)
def test_a_notice_shorter_than_the_checkpoint_is_told_and_the_job_still_stops_at_one_step(
    scene: Scene, runtime_root: Path
) -> None:
    """Every member declares a checkpoint of an hour; a spot notice gives two minutes. The agent
    says so on the leaving pod (an Event, a log line), the leaving worker says which steps are
    at stake, and the job leaves as designed: the save (quicker than declared) completes, every
    rank stops at one step and the two others resume."""
    cloud = scene.clouds[scene.placed[LEAVER]]
    cloud.renew()  # a notice of the cloud's own lead from now
    cloud.post()
    key = f"{scene.namespace}/{LEAVER}"

    def warnings() -> list[Any]:
        return [
            e
            for e in scene.core.list_namespaced_event(scene.namespace).items
            if e.reason == "NoticeShorterThanCheckpoint"
        ]

    [event] = eventually(warnings, timeout=SLOW, what="a NoticeShorterThanCheckpoint Event")
    assert (event.type, event.involved_object.name) == ("Warning", LEAVER)
    given = re.match(r"The notice gives (\d+) s \(leave by \S+, aws terminate\)", event.message)
    assert given is not None, event.message
    assert 0 < int(given.group(1)) <= 120
    assert "but the checkpoint takes 3600 s (shoal.dev/checkpoint-seconds)" in event.message
    assert "the work since the pod's last complete checkpoint will be lost" in event.message
    [line] = _agent_says(scene.agent_of(LEAVER), "notice_shorter_than_checkpoint", key)
    assert (line["given_seconds"], line["checkpoint_seconds"]) == (int(given.group(1)), 3600)

    left_and_resumed(scene, LEAVER)
    [stop_step] = {int(r["step"]) for r in scene.job.records("stop")}
    [log] = (runtime_root / scene.placed[LEAVER] / "pods").glob("*/trainer.log")
    said = re.search(
        r"notice gives (\d+) s, checkpoint takes 3600 s: unless the checkpoint of step "
        rf"{stop_step} completes sooner, steps 0 to {stop_step} will be lost \(no checkpoint yet\)",
        log.read_text(),
    )
    assert said is not None, log.read_text()[-2000:]
    # The worker counts from when it heard, the agent from when it told (the same moment, give
    # or take the loop's turn); each rounds down to whole seconds, so one may be a second above.
    # (The agent once counted from after its annotation write, under load seconds later.)
    assert int(said.group(1)) <= int(given.group(1)) + 1
    # The pods not under notice were not warned.
    assert [e.metadata.name for e in warnings()] == [event.metadata.name]


def left_and_resumed(scene: Scene, leaver: str) -> tuple[float, float]:
    """Check that every rank stopped at one step S, the checkpoint at S is complete, ``leaver``
    was evicted after acknowledging S, and the others trained S+1 onwards with the losses of
    an uninterrupted run; return when the last rank stopped and the first step after it."""
    job, namespace = scene.job, scene.namespace
    stayers = sorted(set(PODS) - {leaver})
    stops = eventually(lambda: _stops(job), timeout=SLOW, what="every rank to stop")
    [stop_step] = {int(r["step"]) for r in stops}
    assert {r["pod"]: r["leaving"] for r in stops} == {pod: pod == leaver for pod in PODS}
    key = f"{namespace}/{leaver}"
    leaving = scene.agent_of(leaver)
    evicted = eventually(
        lambda: _agent_says(leaving, "pod_evicted", key), timeout=SLOW, what="the eviction"
    )
    [acked] = _agent_says(leaving, "worker_acknowledged", key)
    assert (acked["step"], acked["outcome"]) == (stop_step, "accepted")
    # Evicted because it acknowledged (not at a margin before the deadline), after it did.
    assert [line["reason"] for line in evicted] == ["acknowledged"]
    assert evicted[0]["timestamp"] >= acked["timestamp"]
    # Acknowledged only once every rank had saved: the checkpoint is complete.
    assert latest_checkpoint(job.ckpt) == (stop_step, job.ckpt / f"step-{stop_step}")

    codes = eventually(lambda: _finished(scene.runtime), timeout=SLOW, what="every torchrun out")
    # The eviction's SIGTERM stopped the leaving torchrun, which left the rendezvous open; the
    # others finished the training.
    assert codes[leaver] != 0
    assert {pod: codes[pod] for pod in stayers} == dict.fromkeys(stayers, 0)

    starts = job.records("start")
    resumed = [r for r in starts if r["step"] == stop_step + 1]
    assert sorted(r["pod"] for r in resumed) == stayers
    assert {r["world"] for r in resumed} == {2}
    assert not [r for r in starts if r["pod"] == leaver and r["step"] > 0]

    reference = job.reference()
    steps = job.records("step")
    after = {r["step"]: r["loss"] for r in steps if r["step"] > stop_step}
    assert sorted(after) == list(range(stop_step + 1, job.steps))  # no step lost
    assert after == {step: reference[step] for step in after}
    assert {r["loss"] for r in steps if r["step"] == stop_step} == {reference[stop_step]}

    stopped = max(float(r["t"]) for r in stops)
    first_resumed = min(float(r["t"]) for r in steps if r["step"] == stop_step + 1)
    return round(stopped, 3), round(first_resumed, 3)


def _reclaimed(scene: Scene) -> str | None:
    """The member the scheduler asked to leave, from its ``Reclaimed`` Event: the Event stays,
    while the pod's ``shoal.dev/leave-by`` lasts only until the acknowledgement evicts it."""
    for event in scene.core.list_namespaced_event(scene.namespace).items:
        if event.reason == "Reclaimed" and event.involved_object.kind == "Pod":
            assert f"to make room for gang {scene.namespace}/urgent " in event.message
            return str(event.involved_object.name)
    return None


def _leave_by(pod: Any) -> str | None:
    notes: dict[str, str] = pod.metadata.annotations or {}
    return notes.get(names.LEAVE_BY_ANNOTATION)


def _stops(job: Job) -> list[dict[str, Any]] | None:
    stops = job.records("stop")
    return stops if len(stops) >= len(PODS) else None


def _bound(core: Any, namespace: str) -> dict[str, str] | None:
    found = {
        pod.metadata.name: pod.spec.node_name
        for pod in core.list_namespaced_pod(namespace).items
        if pod.spec.node_name
    }
    return found if len(found) == len(PODS) else None


def _agent_says(agent: AgentProcess, event: str, pod: str) -> list[dict[str, Any]]:
    return [
        line for line in agent.log_lines() if line.get("event") == event and line.get("pod") == pod
    ]


def _finished(runtime: Runtime) -> dict[str, int] | None:
    codes = {key.split("/", 1)[1]: c.get("trainer") for key, c in runtime.exit_codes().items()}
    if len(codes) < len(PODS) or any(code is None for code in codes.values()):
        return None
    return {pod: int(code) for pod, code in codes.items() if code is not None}
