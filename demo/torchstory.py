"""The demo's default story: real torchrun elastic training through every membership change.

The same control plane, scheduler and node agents as the simulated story (demo/scenario.py),
with the scheduler's admission webhook wiring the pods. One Indexed Job, ``train`` (a gang of
2..3 pods, 8 GPUs each), runs ``torchrun`` with demo/trainer.py: a tiny deterministic model on
CPU, c10d rendezvous on loopback (the store hosted by the demo, as on a node that stays), gloo,
checkpoints in one shared folder. kwok runs no containers; :class:`fakes.runtime.Runtime` plays
each Running pod's container as a local process, from its command and environment.

The story: the gang starts at its minimum on two nodes and grows when a third arrives; a spot
notice hits one node, every rank stops at one step, checkpoints, the leaving pod acknowledges and
is evicted, the other two re-rendezvous and resume; a new node lets the job regrow; an urgent
gang makes the scheduler reclaim the surplus member, the same way; the urgent gang finishes and
the job regrows. What the summary shows is computed from the ranks' own records and the
checkpoint folder (:func:`changes`), not from what the story expected.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config

from contracts import names
from demo.scenario import HIGH, NAMESPACE, Demo, Options, Show
from devcluster import cluster
from devcluster.ports import free_port
from fakes.runtime import Runtime

ROOT = Path(__file__).resolve().parents[1]
TRAINER = ROOT / "demo" / "trainer.py"
JOB = "train"
MIN, MAX = 2, 3
WEBHOOK = "shoal-demo-wiring"
#: Seconds a rank sleeps after each step: a pace two busy cores keep up with.
STEP_SECONDS = 0.2
#: Steps to train after the job regrew the last time, before the story ends.
TAIL_STEPS = 15
#: Time for launchers and ranks to start and meet on a busy two-core machine.
SLOW = 240.0
_COMPLETE = ".metadata"  # see shoal_worker.distributed.latest_checkpoint


@dataclass(frozen=True, slots=True)
class Change:
    """One membership change, as the ranks recorded it."""

    cause: str
    world_before: int
    world_after: int
    #: Each rank's stop step (by pod name), from its ``stop`` or ``restart`` record.
    stops: dict[str, int]
    #: The highest step any rank trained before the change.
    last_trained: int
    #: The first step of the resumed run.
    resumed_at: int
    #: Whether the checkpoint the resumed run loaded (step ``resumed_at - 1``) is complete.
    checkpoint_complete: bool
    #: From the last rank's stop to the first step of the new world, seconds.
    resume_s: float

    @property
    def lost(self) -> int:
        """Steps trained before the change that the resumed run does not start after."""
        return self.last_trained - (self.resumed_at - 1)

    def row(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "world": f"{self.world_before} -> {self.world_after}",
            "stop_steps": self.stops,
            "last_trained_step": self.last_trained,
            "checkpoint_step": self.resumed_at - 1,
            "checkpoint_complete": self.checkpoint_complete,
            "resumed_at_step": self.resumed_at,
            "steps_lost": self.lost,
            "time_to_resume_s": round(self.resume_s, 1),
        }


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):  # a line being written
            found.append(json.loads(line))
    return found


def changes(
    records: list[dict[str, Any]], ckpt: Path, causes: list[tuple[float, str]]
) -> list[Change]:
    """Every membership change in ``records`` (the trainer's JSON lines): a new round is the
    ranks' ``start`` records with one first step and world size. ``causes`` are (time, what the
    story did), the latest before a change's first stop names it."""
    starts = sorted((r for r in records if r["event"] == "start"), key=lambda r: r["t"])
    rounds: list[dict[str, Any]] = []
    for record in starts:
        key = (record["step"], record["world"])
        if rounds and (rounds[-1]["step"], rounds[-1]["world"]) == key:
            continue
        rounds.append(record)
    found = []
    for before, after in itertools.pairwise(rounds):
        window = [r for r in records if before["t"] <= r["t"] < after["t"]]
        stops = {r["pod"]: int(r["step"]) for r in window if r["event"] in ("stop", "restart")}
        trained = [int(r["step"]) for r in window if r["event"] == "step"]
        first_steps = [
            float(r["t"])
            for r in records
            if r["event"] == "step" and r["step"] == after["step"] and r["t"] >= after["t"]
        ]
        stopped_at = max(
            (float(r["t"]) for r in window if r["event"] in ("stop", "restart")),
            default=float(before["t"]),
        )
        first_stop = min(
            (float(r["t"]) for r in window if r["event"] in ("stop", "restart")),
            default=float(after["t"]),
        )
        cause = next((what for t, what in reversed(causes) if t <= first_stop), "?")
        resumed_at = int(after["step"])
        found.append(
            Change(
                cause=cause,
                world_before=int(before["world"]),
                world_after=int(after["world"]),
                stops=dict(sorted(stops.items())),
                last_trained=max(trained, default=resumed_at - 1),
                resumed_at=resumed_at,
                checkpoint_complete=resumed_at == 0
                or (ckpt / f"step-{resumed_at - 1}" / _COMPLETE).is_file(),
                resume_s=(min(first_steps) - stopped_at) if first_steps else float("nan"),
            )
        )
    return found


class _StoryOver(Exception):
    """An expectation failed (and was recorded): the story cannot go on."""


class TorchDemo(Demo):
    """The real-torch story (see the module's description)."""

    spot_fraction = 1.0

    def __init__(self, options: Options, say: Any, show: Show | None = None) -> None:
        super().__init__(options, say, show)
        # Short: a unix socket's path has at most 107 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="shoal-demo-"))
        self.runtimes: list[Runtime] = []
        self.webhook_port = free_port()
        self.store: Any = None
        self.causes: list[tuple[float, str]] = []
        self.records_path = options.out / "train.jsonl"
        self.ckpt = options.out / "checkpoints"
        self.progress_at = 0.0
        self.steps: list[tuple[float, int, int]] = []  # (seconds since start, step, world)

    # -- set-up ------------------------------------------------------------------------------
    def reclaim_grace(self) -> float:
        return 30.0  # a real checkpoint, not a compressed one, has to fit in it

    def scheduler_args(self) -> list[str]:
        return [
            "--webhook",
            "true",
            "--webhook-port",
            str(self.webhook_port),
            "--webhook-hosts",
            "127.0.0.1",
            "--webhook-configuration",
            WEBHOOK,
        ]

    def socket_path(self, node: str) -> Path:
        # Where fakes.runtime puts node's hostPath /run/shoal, which the webhook mounts.
        return self.root / node / "run" / "shoal" / "agent.sock"

    def start_cluster(self, bin_dir: Path) -> None:
        from torch._C._distributed_c10d import TCPStore

        for stale in (self.records_path, self.options.out / "train-reference.jsonl"):
            stale.unlink(missing_ok=True)
        shutil.rmtree(self.ckpt, ignore_errors=True)
        self.say(f"starting the control plane ({self.run_dir})")

        self.handle = cluster.up(
            self.run_dir,
            bin_dir,
            cluster.Options(die_with_parent=not self.options.keep),
            say=lambda _m: None,
        )
        self.api = config.new_client_from_config(config_file=str(self.handle.kubeconfig))
        client.CoreV1Api(self.api).create_namespace({"metadata": {"name": NAMESPACE}})
        client.SchedulingV1Api(self.api).create_priority_class(
            {
                "metadata": {"name": HIGH},
                "value": 100000,
                "description": "Shoal demo: an urgent job that reclaims surplus members",
            }
        )
        client.AdmissionregistrationV1Api(self.api).create_mutating_webhook_configuration(
            self.webhook_configuration()
        )
        self.start_scheduler()
        self.store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    def webhook_configuration(self) -> dict[str, Any]:
        return {
            "metadata": {"name": WEBHOOK},
            "webhooks": [
                {
                    "name": "wiring.shoal.dev",
                    "clientConfig": {"url": f"https://127.0.0.1:{self.webhook_port}/mutate"},
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                        }
                    ],
                    "matchConditions": [
                        {
                            "name": "shoal-pods",
                            "expression": f"object.spec.schedulerName == '{names.SCHEDULER_NAME}'",
                        }
                    ],
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}
                    },
                    "failurePolicy": "Ignore",
                    "sideEffects": "None",
                    "timeoutSeconds": 3,
                    "reinvocationPolicy": "IfNeeded",
                    "admissionReviewVersions": ["v1"],
                }
            ],
        }

    def webhook_ready(self) -> bool:
        """Whether the API server calls the scheduler's webhook: a dry-run pod comes back wired."""
        probe = self.pod_body("probe", containers=[self.container(["true"], [])])
        try:
            made = client.CoreV1Api(self.api).create_namespaced_pod(NAMESPACE, probe, dry_run="All")
        except client.exceptions.ApiException:
            return False
        return any(v.name == "shoal-notice" for v in made.spec.volumes or [])

    def add_nodes(self, count: int, *, prefix: str) -> list[str]:
        created = super().add_nodes(count, prefix=prefix)
        assert self.handle is not None
        self.runtimes.append(
            Runtime(
                str(self.handle.kubeconfig),
                NAMESPACE,
                created,
                self.root,
                selector=f"demo.shoal.dev/job={JOB}",
            ).start()
        )
        return created

    # -- the pods ----------------------------------------------------------------------------
    def container(self, command: list[str], args: list[str]) -> dict[str, Any]:
        env = {
            "PYTHONPATH": str(ROOT),
            "OMP_NUM_THREADS": "1",
            # torchrun caches where rank 0's store was; a rank 0 that left would be waited for.
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            "LOGLEVEL": "WARNING",
        }
        return {
            "name": "trainer",
            "image": "registry.example.com/trainer:1.0",
            "command": command,
            "args": args,
            "env": [{"name": k, "value": v} for k, v in env.items()],
            "resources": {
                "limits": {names.GPU_RESOURCE: "8"},
                "requests": {"cpu": "4", "memory": "16Gi"},
            },
        }

    def pod_body(self, name: str, containers: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "metadata": {"name": name},
            "spec": {
                "schedulerName": names.SCHEDULER_NAME,
                "automountServiceAccountToken": False,  # the trainer needs no API access
                "tolerations": [{"key": names.KWOK_TAINT, "operator": "Exists"}],
                "containers": containers,
            },
        }

    def torchrun(self) -> tuple[list[str], list[str]]:
        rdzv = "is_host=false,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=5"
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={MIN}:{MAX}",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{self.store.port}",
            f"--rdzv-id={JOB}",
            f"--rdzv-conf={rdzv}",
            "--max-restarts=50",
            "--monitor-interval=0.1",
        ]
        args = [
            str(TRAINER),
            f"--ckpt={self.ckpt}",
            f"--records={self.records_path}",
            "--steps=1000000",
            "--seed=7",
            f"--step-seconds={STEP_SECONDS}",
            "--eviction-wait=60",
        ]
        return command, args

    def submit_training(self) -> None:
        command, args = self.torchrun()
        body = self.pod_body("unused", [self.container(command, args)])
        template = {
            "metadata": {
                "labels": {names.GANG_LABEL: JOB, "demo.shoal.dev/job": JOB},
                "annotations": {
                    names.MIN_MEMBER_ANNOTATION: str(MIN),
                    names.MAX_MEMBER_ANNOTATION: str(MAX),
                },
            },
            "spec": {**body["spec"], "restartPolicy": "Never", "terminationGracePeriodSeconds": 30},
        }
        job = {
            "metadata": {"name": JOB},
            "spec": {
                "completionMode": "Indexed",
                "completions": MAX,
                "parallelism": MAX,
                "backoffLimit": 1000,
                "podFailurePolicy": {
                    "rules": [
                        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
                    ]
                },
                "template": template,
            },
        }
        client.BatchV1Api(self.api).create_namespaced_job(NAMESPACE, job)
        self.say(
            f"submitted {JOB}: an Indexed Job, gang of {MIN}..{MAX} pods x 8 GPUs, each running "
            f"torchrun --nnodes={MIN}:{MAX} (wired by the scheduler's webhook)"
        )

    def submit_urgent(self) -> None:
        body = self.pod_body("urgent", [self.container(["sleep", "infinity"], [])])
        body["metadata"]["labels"] = {names.GANG_LABEL: "urgent"}
        body["spec"]["priorityClassName"] = HIGH
        client.CoreV1Api(self.api).create_namespaced_pod(NAMESPACE, body)
        self.say(f"submitted urgent: one pod x 8 GPUs, priority {HIGH}; no node is free")

    # -- what the ranks recorded -------------------------------------------------------------
    def records(self, event: str | None = None) -> list[dict[str, Any]]:
        found = read_records(self.records_path)
        return [r for r in found if event is None or r["event"] == event]

    def world(self) -> tuple[int, int]:
        """(world size, highest step) of the latest steps trained."""
        steps = self.records("step")
        if not steps:
            return 0, -1
        last = max(steps, key=lambda r: r["t"])
        return int(last["world"]), max(int(r["step"]) for r in steps)

    def training_at(self, world: int, after: int) -> bool:
        """Whether a world of ``world`` ranks trained a step beyond ``after``."""
        return (
            any(r["world"] == world and r["step"] > after for r in self.records("step"))
            and self.world()[0] == world
        )

    def cause(self, what: str) -> None:
        self.causes.append((time.time(), what))

    def pods_of(self, job: str) -> dict[str, str]:
        """Bound, not terminating pods of ``job`` (gang label): name -> node."""
        items = (
            client.CoreV1Api(self.api)
            .list_namespaced_pod(NAMESPACE, label_selector=f"{names.GANG_LABEL}={job}")
            .items
        )
        return {
            p.metadata.name: p.spec.node_name
            for p in items
            if p.spec.node_name
            and p.metadata.deletion_timestamp is None
            and p.status.phase not in ("Succeeded", "Failed")
        }

    # -- the story ---------------------------------------------------------------------------
    async def watch(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            bound = await loop.run_in_executor(None, self.pods_of, JOB)
            urgent = await loop.run_in_executor(None, self.pods_of, "urgent")
            world, step = self.world()
            self.samples.append((self.now(), {JOB: 8 * len(bound), "urgent": 8 * len(urgent)}))
            self.steps.append((self.now(), step, world))
            if time.monotonic() - self.progress_at > 10 and step >= 0:
                self.progress_at = time.monotonic()
                self.say(f"  ... {JOB}: step {step}, world {world}, {len(bound)} pod(s) bound")
            await asyncio.sleep(1.0)

    async def train(self, stop: asyncio.Event) -> None:
        await stop.wait()

    async def story(self) -> None:
        with contextlib.suppress(_StoryOver):
            await self.acts()

    async def need(self, what: str, check: Callable[[], Any], within: float = SLOW) -> Any:
        """``check()`` once it is truthy; a failed expectation ends the story."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            await asyncio.sleep(0.5)
        self.fail(f"timed out after {within:.0f} s waiting for {what}")
        raise _StoryOver

    async def acts(self) -> None:
        await self.need("the API server to call the scheduler's webhook", self.webhook_ready, 60)
        self.add_nodes(MIN, prefix="gpu")
        self.submit_training()
        await self.need(f"{JOB} to train at world {MIN}", lambda: self.training_at(MIN, 3))
        self.say(f"{JOB} admitted at its minimum: {MIN} pods, torchrun world {MIN}, training")
        await self.snapshot("admitted", f"{JOB} admitted at its minimum")

        self.cause("grow: a node arrives")
        self.add_nodes(1, prefix="gpu-b")
        await self.grown("the third pod joins; torchrun restarts the round with it")

        victim_pod, victim = sorted(self.pods_of(JOB).items())[0]
        self.cause(f"spot notice on {victim}")
        lead = self.post_notice(self.clouds[victim])
        posted = time.monotonic()
        self.node_state[victim] = "revoking"
        self.say(
            f"spot revocation of {victim} (runs {victim_pod}): {self.options.cloud} notice with "
            f"{lead:.0f} s lead (compressed {self.options.compression:g}x)"
        )
        await self.shrunk(victim_pod)
        await self.snapshot("spot-notice", f"after the spot notice took {victim_pod}")
        await asyncio.sleep(max(0.0, lead - (time.monotonic() - posted)))
        self.remove_node(victim)
        self.say(f"{victim} revoked by the cloud; the replacement pod waits for capacity")

        self.cause("regrow: a new spot node arrives")
        self.add_nodes(1, prefix="gpu-c")
        await self.grown("the replacement pod joins")

        self.cause("reclaim for the urgent gang")
        self.submit_urgent()
        reclaimed = await self.need(f"the scheduler to reclaim a member of {JOB}", self.reclaimed)
        self.say(f"the scheduler reclaims {reclaimed} for urgent (shoal.dev/leave-by)")
        await self.shrunk(reclaimed)
        await self.need("urgent to be bound", lambda: self.pods_of("urgent"))
        self.say("urgent bound in the room the reclaim made")
        await self.snapshot("reclaimed", f"after the reclaim of {reclaimed} for urgent")

        self.cause("regrow: the urgent gang finishes")
        client.CoreV1Api(self.api).delete_namespaced_pod(
            "urgent", NAMESPACE, grace_period_seconds=0
        )
        self.say("urgent finishes; its node is free again")
        await self.grown("the replacement pod joins")
        _, step = self.world()
        await self.need(f"{TAIL_STEPS} more steps", lambda: self.world()[1] >= step + TAIL_STEPS)
        self.say(f"{JOB} reached step {self.world()[1]}; the story ends")
        await self.snapshot("end", "the end")

    async def grown(self, how: str) -> None:
        _, step = self.world()
        await self.need(f"{JOB} to train at world {MAX}", lambda: self.training_at(MAX, step))
        self.say(f"{JOB} grows to {MAX} pods: {how}; world {MAX} resumes")

    async def shrunk(self, leaver: str) -> None:
        """After the latest cause's notice: every rank stopped, ``leaver`` gone, the others
        training again."""
        since = self.causes[-1][0]
        stop = await self.need("every rank to stop at one step", lambda: self.stopped_since(since))
        self.say(
            f"every rank stops after step {stop}, checkpoints it; {leaver} acknowledges and leaves"
        )
        await self.need(f"{leaver} to be evicted", lambda: leaver not in self.pods_of(JOB))
        await self.need(f"{JOB} to resume at world {MIN}", lambda: self.training_at(MIN, stop))
        self.say(f"the other {MIN} re-rendezvous and resume at step {stop + 1}")

    def stopped_since(self, since: float) -> int | None:
        """The stop step once a notice stopped MAX ranks after ``since`` (time.time())."""
        stops = [r for r in self.records("stop") if r["t"] >= since]
        return int(max(r["step"] for r in stops)) if len(stops) >= MAX else None

    def reclaimed(self) -> str | None:
        """The member asked to leave for urgent, from the scheduler's ``Reclaimed`` Event on it:
        the Event stays, while the pod's ``shoal.dev/leave-by`` lasts only until the member
        acknowledges and is evicted, which can be quicker than a poll."""
        for event in client.CoreV1Api(self.api).list_namespaced_event(NAMESPACE).items:
            if (
                event.reason == "Reclaimed"
                and event.involved_object.kind == "Pod"
                and f"for gang {NAMESPACE}/urgent " in (event.message or "")
            ):
                return str(event.involved_object.name)
        return None

    # -- the end -----------------------------------------------------------------------------
    def shutdown(self) -> None:
        if not self.options.keep:
            for runtime in self.runtimes:
                runtime.close()
            if self.store is not None:
                del self.store
            # The pods' output (torchrun and the ranks) joins the components' logs.
            pods = self.options.out / "logs" / "pods"
            shutil.rmtree(pods, ignore_errors=True)
            shutil.copytree(self.root, pods, ignore=shutil.ignore_patterns("*.sock"))
            shutil.rmtree(self.root, ignore_errors=True)
        super().shutdown()

    def summary(self) -> dict[str, Any]:
        records = self.records()
        found = changes(records, self.ckpt, self.causes)
        steps = {int(r["step"]) for r in records if r["event"] == "step"}
        for change in found:
            if change.lost:
                self.fail(f"{change.cause}: {change.lost} step(s) lost")
            if len(set(change.stops.values())) > 1:
                self.fail(f"{change.cause}: the ranks stopped at different steps {change.stops}")
            if not change.checkpoint_complete:
                self.fail(f"{change.cause}: no complete checkpoint at {change.resumed_at - 1}")
        return {
            "steps": max(steps) + 1 if steps else 0,
            "steps_missing": sorted(set(range(max(steps, default=-1) + 1)) - steps),
            "steps_lost": sum(c.lost for c in found),
            "changes": [c.row() for c in found],
        }
