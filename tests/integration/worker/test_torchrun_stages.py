"""A real torchrun job that moves through stages of 2, 4 and 2 pods and sets its own gang's
bounds through the API (``worker/examples/stages/``, docs/workers.md "Stages"), on the
devcluster: the real scheduler and its webhook, a real agent per kwok node, the pods' torchrun
run as host processes by :mod:`fakes.runtime`, the trainer holding only the rights of the
example's ``rbac.yaml``. Every change stops every rank at one step and no step is lost: read from
the trainer's own step log (every step trained once, by a round of its stage's size, with the
losses of a run that never stopped), and the members bound in each stage from the API server."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("torch")

from kubernetes import client

from contracts import names
from fakes import metadata
from fakes.clouds import Aws
from fakes.runtime import Runtime
from tests import figures, waiting
from tests.integration.conftest import Devcluster, token_kubeconfig
from tests.integration.history import History, State
from tests.integration.nodeagent.harness import AgentProcess, eventually
from tests.integration.scheduler.conftest import KWOK_TOLERATION, TEST_LABEL, Pool
from tests.integration.scheduler.test_webhook import Webhook
from tests.integration.worker.test_torchrun_pods import (  # noqa: F401 (fixtures)
    runtime_root,
    servers,
)
from tests.unit.worker.torchjob import ROOT, rendezvous_store

pytestmark = pytest.mark.timeout(waiting.TRAINING_TIMEOUT)

SECTION = "torchrun stages"
EXAMPLE = ROOT / "worker" / "examples" / "stages"
GANG = "stages"
ACCOUNT = "shoal-stage-trainer"
PODS = [f"{GANG}-{i}" for i in range(4)]
#: members:steps[:cpu] per stage: 2 pods (CPU-heavy), then 4, then 2.
STAGES = "2:8:cpu,4:8,2:8"
SIZES = [2, 4, 2]
TOTAL = 24
#: Time for ranks and launchers on a busy two-core machine.
SLOW = 240


class Log:
    """The trainer's own records (``--records``), one JSON line per rank and event."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, event: str | None = None) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        lines = [json.loads(line) for line in self.path.read_text().splitlines() if line]
        return [r for r in lines if event is None or r["event"] == event]


def _trainer_args(ckpt: str, records: Path) -> list[str]:
    return [
        str(EXAMPLE / "train.py"),
        f"--ckpt={ckpt}",
        f"--records={records}",
        f"--stages={STAGES}",
        f"--gang={GANG}",
        "--step-seconds=0.05",
        "--eviction-wait=120",
    ]


def _rbac(devcluster: Devcluster, namespace: str) -> None:
    """The example's ServiceAccount, Role and RoleBinding, in the test's namespace."""
    core = devcluster.core()
    rbac = client.RbacAuthorizationV1Api(devcluster.api)
    for doc in yaml.safe_load_all((EXAMPLE / "rbac.yaml").read_text()):
        doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects") or []:
            subject["namespace"] = namespace
        kind = doc["kind"]
        if kind == "ServiceAccount":
            core.create_namespaced_service_account(namespace, doc)
        elif kind == "Role":
            rbac.create_namespaced_role(namespace, doc)
        else:
            assert kind == "RoleBinding", kind
            rbac.create_namespaced_role_binding(namespace, doc)


def _token_kubeconfig(devcluster: Devcluster, namespace: str, path: Path) -> Path:
    """What a pod of the ServiceAccount gets as its projected token, as a kubeconfig (the
    runtime mounts no projected volume)."""
    return Path(token_kubeconfig(devcluster, namespace, ACCOUNT, path))


def _allowed(
    devcluster: Devcluster, home: str, verb: str, *, namespace: str = "", sub: str = ""
) -> bool:
    """Whether the trainer's ServiceAccount (of namespace ``home``) may ``verb`` pods (their
    subresource ``sub``) in ``namespace`` (default: its own)."""
    review = {
        "spec": {
            "user": f"system:serviceaccount:{home}:{ACCOUNT}",
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{home}"],
            "resourceAttributes": {
                "namespace": namespace or home,
                "verb": verb,
                "resource": "pods",
                "subresource": sub,
            },
        }
    }
    answer = client.AuthorizationV1Api(devcluster.api).create_subject_access_review(review)
    return bool(answer.status.allowed)


@dataclass(frozen=True)
class Files:
    """Where the job keeps its checkpoints and records, and the trainer's credentials."""

    ckpt: str
    records: Path
    kubeconfig: Path


def _member(webhook: Webhook, pool: Pool, name: str, port: int, job: Files) -> Any:
    # A round waits up to 10 s for more members once it has its minimum (the new members of a
    # stage join one round, not one each), and a launcher is dropped after 10 s of silence
    # (on a busy machine 5 s dropped live ones, and each drop restarts every round).
    rdzv = "is_host=false,last_call_timeout=10,keep_alive_interval=1,keep_alive_max_attempt=10"
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2:4",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=stages",
        f"--rdzv-conf={rdzv}",
        "--max-restarts=10",
        "--monitor-interval=0.1",
    ]
    env = {
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "LOGLEVEL": "WARNING",
        "KUBECONFIG": str(job.kubeconfig),
    }
    return webhook.pod(
        name,
        labels={names.GANG_LABEL: GANG},
        annotations={names.MIN_MEMBER_ANNOTATION: "2", names.MAX_MEMBER_ANNOTATION: "2"},
        spec={
            "serviceAccountName": ACCOUNT,
            "tolerations": [KWOK_TOLERATION],
            "nodeSelector": {TEST_LABEL: pool.pool},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.example.com/train:1",
                    "command": torchrun,
                    "args": _trainer_args(job.ckpt, job.records),
                    "env": [{"name": k, "value": v} for k, v in env.items()],
                    "resources": {"limits": {names.GPU_RESOURCE: "4"}},
                }
            ],
        },
    )


def _reference(tmp: Path) -> dict[int, float]:
    """The losses of one process that never stopped (the trainer without torchrun)."""
    log = tmp / "reference.jsonl"
    args = _trainer_args(str(tmp / "reference-ckpt"), log)
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, *args], env=env, check=True, capture_output=True)
    return {r["step"]: r["loss"] for r in Log(log)("step")}


@pytest.fixture
def agents(
    pool: Pool,
    servers: metadata.Threaded,  # noqa: F811
    runtime_root: Path,  # noqa: F811
) -> Iterator[tuple[list[str], dict[str, AgentProcess]]]:
    made = pool.add(2, gpus=8)  # room for the four 4-GPU members of the widest stage
    started: dict[str, AgentProcess] = {}
    try:
        for node in made:
            agent = AgentProcess(
                kubeconfig=pool.devcluster.kubeconfig,
                node=node,
                provider="aws",
                metadata_url=Aws(servers).url,
                workdir=runtime_root / node / "run" / "shoal",
            )
            agent.workdir.mkdir(parents=True)
            agent.start()
            started[node] = agent
        yield made, started
    finally:
        for agent in started.values():
            agent.stop()


def _live_bound(state: State) -> int:
    return sum(
        1
        for name, pod in state.items()
        if name in PODS and pod.spec.node_name and pod.metadata.deletion_timestamp is None
    )


def _in_force(
    record: tuple[list[State], list[float]], wall_from: float, wall_to: float
) -> set[int]:
    """The live bound members in every state the API server was in between two wall times
    (``record``: the watch's states and when each arrived, ``time.monotonic()``)."""
    offset = time.time() - time.monotonic()
    states, times = record
    first = max((i for i, at in enumerate(times) if at + offset <= wall_from), default=0)
    last = max(i for i, at in enumerate(times) if at + offset <= wall_to)
    return {_live_bound(states[i]) for i in range(first, last + 1)}


def test_a_trainer_moves_through_stages_of_2_4_and_2_pods_and_loses_no_step(
    pool: Pool,
    webhook: Webhook,
    runtime_root: Path,  # noqa: F811
    agents: tuple[list[str], dict[str, AgentProcess]],
    tmp_path: Path,
) -> None:
    devcluster, namespace = pool.devcluster, webhook.namespace
    made, by_node = agents
    _rbac(devcluster, namespace)
    # Just the rights it needs: list and patch its namespace's pods, nothing else.
    assert _allowed(devcluster, namespace, "list")
    assert _allowed(devcluster, namespace, "patch")
    assert not _allowed(devcluster, namespace, "delete")
    assert not _allowed(devcluster, namespace, "get")
    assert not _allowed(devcluster, namespace, "create", sub="eviction")
    assert not _allowed(devcluster, namespace, "patch", sub="status")
    assert not _allowed(devcluster, namespace, "patch", namespace="default")
    job = Files(
        str(tmp_path / "ckpt"),
        tmp_path / "train.jsonl",
        _token_kubeconfig(devcluster, namespace, tmp_path / "trainer.kubeconfig"),
    )
    log = Log(job.records)
    store = rendezvous_store()
    runtime = Runtime(
        devcluster.kubeconfig, namespace, made, runtime_root, selector=f"{names.GANG_LABEL}={GANG}"
    ).start()
    core = devcluster.core()
    history = History(core.list_namespaced_pod, namespace)
    try:
        for name in PODS:
            core.create_namespaced_pod(namespace, _member(webhook, pool, name, store.port, job))
        eventually(
            lambda: len(log("done")) == SIZES[-1],
            timeout=SLOW * 2,
            what=f"the last stage's ranks to finish ({runtime_root}, {tmp_path})",
        )
        history.caught_up()
        # Every state the pods were in, and when each arrived, kept before the watch closes.
        watched = history._record()
    finally:
        runtime.close()
        history.close()

    steps = log("step")
    # 0 steps lost: every step trained once, by one round of its stage's size, and the losses
    # are those of one process that never stopped.
    by_step: dict[int, list[dict[str, Any]]] = {}
    for record in steps:
        by_step.setdefault(int(record["step"]), []).append(record)
    assert sorted(by_step) == list(range(TOTAL))
    trained_twice = [s for s, rs in by_step.items() if len(rs) != rs[0]["world"]]
    figures.record(SECTION, "stages 2 -> 4 -> 2: steps lost", len(trained_twice))
    assert trained_twice == []
    reference = _reference(tmp_path)
    assert {s: {r["loss"] for r in rs} for s, rs in by_step.items()} == {
        s: {reference[s]} for s in range(TOTAL)
    }
    # Each stage trained by its own number of ranks, and every start after the first resumed
    # right after a complete checkpoint.
    for stage, size in enumerate(SIZES):
        assert {r["world"] for r in steps if r["stage"] == stage} == {size}, stage
    starts = sorted({int(r["step"]) for r in log("start")})
    assert starts[0] == 0
    assert set(starts) <= {0, 8, 16}
    # The trainer wrote its bounds; the scheduler told the surplus through the notice path.
    assert [(r["members"], r["step"]) for r in log("bounds")] == [(4, 7), (2, 15)]
    stops = log("stop")
    assert {int(r["step"]) for r in stops} == {15}
    assert sum(1 for r in stops if r["leaving"]) == 2
    leavers = {r["pod"] for r in stops if r["leaving"]}
    for pod in leavers:
        told = [e for e in core.list_namespaced_event(namespace).items if e.reason == "Reclaimed"]
        assert any(e.involved_object.name == pod for e in told), pod
    # The members bound in each stage, from the API server: the state it was in all along.
    for stage, size in enumerate(SIZES):
        ts = [float(r["t"]) for r in steps if r["stage"] == stage]
        assert _in_force(watched, min(ts), max(ts)) == {size}, stage
        figures.record(
            SECTION,
            f"stage {stage + 1} ({size} pods): first to last step (s)",
            round(max(ts) - min(ts), 2),
        )
    # The CPU-heavy first stage, as the trainer measured it (CPU seconds of a rank's step,
    # the median: a collective can spin now and then).
    cpu = {
        stage: statistics.median(r["cpu"] for r in steps if r["stage"] == stage)
        for stage in range(len(SIZES))
    }
    assert cpu[0] > 3 * max(cpu[1], cpu[2]), cpu
    bounds = {r["members"]: float(r["t"]) for r in log("bounds")}
    first = {stage: min(float(r["t"]) for r in steps if r["stage"] == stage) for stage in (1, 2)}
    figures.record(
        SECTION, "bounds raised to 4 -> first step of 4 pods (s)", round(first[1] - bounds[4], 2)
    )
    figures.record(
        SECTION, "bounds lowered to 2 -> first step of 2 pods (s)", round(first[2] - bounds[2], 2)
    )
    # The leaving pods acknowledged the saved step, and their agent evicted them for it.
    acknowledged = [
        line
        for agent in by_node.values()
        for line in agent.log_lines()
        if line.get("event") == "worker_acknowledged"
    ]
    assert sorted((line["pod"], line["step"]) for line in acknowledged) == sorted(
        (f"{namespace}/{pod}", 15) for pod in leavers
    )
