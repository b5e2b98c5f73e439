"""The demo scenario: elastic gangs on spot capacity, an early warning, a revocation, a reclaim
by least loss, and regrowth.

Everything is real but the cloud and the GPUs: a devcluster control plane, kwok GPU nodes, the
Shoal scheduler and one Shoal node agent per node as separate processes, each agent watching its
own fake metadata server. Jobs are Indexed Jobs (elastic gangs by label). kwok runs no
containers, so each Running pod's "worker" is a task here that uses the worker library over the
agent's notice socket: it trains (the job's step advances while its gang is at or above its
minimum), reports its job's last complete checkpoint to the agent (the ``Progress`` call, once
the job has one), checkpoints and acknowledges when told to leave, and is gone when its pod is.

Both stories start the scheduler with its web view on a free loopback port, print the address,
and at each key moment show ``kubectl shoal gangs`` as a user would see it (:meth:`Demo.snapshot`:
the real plugin in a subprocess with the demo's kubeconfig), saved under ``OUT/views/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config
from shoal_worker import NoticeClient, PodIdentity
from shoal_worker.progress import Report

from contracts import names
from contracts.progress import Progress, decode_or_none
from devcluster import cluster, nodes, process
from fakes import metadata
from fakes.clouds import CLOUDS, Aws, Azure, Cloud, Gcp

NAMESPACE = "training"
HIGH = "shoal-demo-urgent"
TICK = 0.5  # seconds per training step
#: At least this long between the two jobs' checkpoints before the reclaim (the progress
#: annotation's times are whole seconds): the reclaim's choice is then not a near tie.
CHECKPOINT_GAP = 6.0
#: How long ``kubectl shoal gangs`` may take to answer before the demo calls it hung (a second or
#: two on a quiet machine; over a minute once on one loaded by two test runs).
ANSWER_WITHIN = 180


class ExpectationFailed(Exception):
    """Something a user relies on did not hold; the message says what."""


@dataclass(frozen=True, slots=True)
class JobPlan:
    name: str
    min: int
    max: int
    priority_class: str | None = None


@dataclass(slots=True)
class JobState:
    plan: JobPlan
    step: int = 0
    saved: int = 0
    #: When its last complete checkpoint was taken (seconds since the epoch); None: none yet.
    saved_at: float | None = None
    lost: int = 0
    bound: int = 0
    below_target_s: float = 0.0
    departures: list[float] = field(default_factory=list)
    replacement_latency: list[float] = field(default_factory=list)
    partial_since: float | None = None
    finished: bool = False


@dataclass(slots=True)
class PodState:
    uid: str
    name: str
    job: str
    node: str
    running_since: float
    checkpointed: bool = False
    #: Asked to leave for another gang (a reclaim), or for its own (moved off a warned node).
    reclaimed: bool = False
    moved: bool = False
    #: Its ``shoal.dev/progress`` annotation as last listed.
    progress: Progress | None = None
    task: asyncio.Task[None] | None = None


@dataclass(slots=True)
class Options:
    nodes: int = 16
    cloud: str = "aws"
    compression: float = 6.0
    out: Path = Path("demo-out")
    live: bool = True
    keep: bool = False


def plans(node_count: int) -> tuple[list[JobPlan], JobPlan]:
    """Three jobs that fill all but two nodes at their maximum, and an urgent one."""
    if node_count >= 16:
        jobs = [JobPlan("llama", 3, 6), JobPlan("bert", 2, 4), JobPlan("resnet", 2, 4)]
        return jobs, JobPlan("urgent", 4, 4, HIGH)
    if node_count >= 8:
        # One member for the urgent job: the reclaim chooses which of the two jobs gives it.
        return [JobPlan("llama", 2, 3), JobPlan("bert", 2, 3)], JobPlan("urgent", 1, 1, HIGH)
    raise ValueError("the demo needs at least 8 nodes")


#: Prints a heading and a block of text (a ``kubectl shoal`` output) above any live display.
Show = Callable[[str, str], None]


class Demo:
    def __init__(
        self, options: Options, say: Callable[[str], None], show: Show | None = None
    ) -> None:
        self.options = options
        self.say_line = say
        self.show = show or (lambda heading, text: say(f"{heading}\n{text}".rstrip()))
        (self.web_port,) = cluster.free_ports(["web-view"]).values()
        self.web_url = f"http://127.0.0.1:{self.web_port}/"
        #: The ``kubectl shoal gangs`` snapshots taken: moment and file (relative to --out).
        self.views: list[dict[str, str]] = []
        self.started = time.monotonic()
        self.events: list[str] = []
        self.failures: list[str] = []
        self.jobs: dict[str, JobState] = {}
        self.pods: dict[str, PodState] = {}
        self.samples: list[tuple[float, dict[str, int]]] = []
        self.node_state: dict[str, str] = {}
        self.node_pods: dict[str, list[str]] = {}
        self.procs: list[process.Proc] = []
        self.agents: dict[str, tuple[process.Proc, str]] = {}
        self.clouds: dict[str, Cloud] = {}
        self.servers = metadata.Threaded()
        self.handle: cluster.Cluster | None = None
        self.api: Any = None
        self.run_dir = options.out / "cluster"
        self.growth_done = False
        #: When each pod left (seconds since the start), by name.
        self.gone_at: dict[str, float] = {}
        #: Workers that left, in order.
        self.left: list[PodState] = []
        #: Replacements that came up after growth: (seconds since the start, job, pod, node).
        self.replacements: list[tuple[float, str, str, str]] = []
        #: What the early warning and the reclaim did, with figures (the summary's sections).
        self.beats: dict[str, Any] = {}

    # -- output ------------------------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self.started

    def say(self, text: str) -> None:
        line = f"[{self.now():6.1f}s] {text}"
        self.events.append(line)
        self.say_line(line)

    def fail(self, text: str) -> None:
        self.failures.append(text)
        self.say(f"EXPECTATION FAILED: {text}")

    # -- set-up ------------------------------------------------------------------------------
    def start_cluster(self, bin_dir: Path) -> None:
        self.say(f"starting the control plane ({self.run_dir})")
        self.handle = cluster.up(
            self.run_dir,
            bin_dir,
            cluster.Options(die_with_parent=not self.options.keep),
            say=lambda _m: None,
        )
        self.api = config.new_client_from_config(config_file=str(self.handle.kubeconfig))
        core = client.CoreV1Api(self.api)
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        client.SchedulingV1Api(self.api).create_priority_class(
            {
                "metadata": {"name": HIGH},
                "value": 100000,
                "description": "Shoal demo: an urgent job that reclaims surplus members",
            }
        )
        self.add_nodes(self.options.nodes, prefix="gpu")
        self.start_scheduler()

    def add_nodes(self, count: int, *, prefix: str) -> list[str]:
        assert self.handle is not None
        spec = nodes.NodeSpec(
            count=count,
            gpus=8,
            prefix=prefix,
            spot_fraction=self.spot_fraction,
            racks_per_zone=min(2, count),
        )
        created = nodes.create(str(self.handle.kubeconfig), spec)
        for name in created:
            self.node_state[name] = "ready"
            self.start_agent(name)
        spot = "spot" if self.spot_fraction == 1 else "half spot"
        self.say(
            f"{len(created)} kwok GPU node(s) (8 GPUs, two NVLink islands each, {spot}), "
            f"each with a node agent watching its own fake {self.options.cloud} metadata"
        )
        return created

    # What the real-torch story changes (demo/torchstory.py).
    spot_fraction = 0.5

    def reclaim_grace(self) -> float:
        return max(2.0, 30.0 / self.options.compression)

    def scheduler_args(self) -> list[str]:
        return []

    def socket_path(self, node: str) -> Path:
        return self.options.out / "sockets" / f"{node}.sock"

    def start_scheduler(self) -> None:
        assert self.handle is not None
        grace = self.reclaim_grace()
        argv = [
            _python(),
            "-m",
            "scheduler",
            "--kubeconfig",
            str(self.handle.kubeconfig),
            "--http-host",
            "127.0.0.1",
            "--http-port",
            "0",
            "--log-format",
            "json",
            "--max-backoff",
            "2",
            "--reclaim-grace",
            str(grace),
            "--web-view",
            f"127.0.0.1:{self.web_port}",
            *self.scheduler_args(),
        ]
        proc, _ = process.spawn(
            "scheduler",
            argv,
            self.options.out / "logs" / "scheduler.log",
            die_with_parent=not self.options.keep,
        )
        self.procs.append(proc)
        self.say(f"Shoal scheduler started (reclaim grace {grace:.0f} s)")
        self.show(f"Live view: {self.web_url}", "")

    async def snapshot(self, slug: str, moment: str) -> None:
        """Show and save ``kubectl shoal gangs`` for the demo's namespace, run as a user runs it:
        the plugin in its own process, with the demo's admin kubeconfig."""
        assert self.handle is not None
        folder = self.options.out / "views"
        if not self.views:
            shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)
        argv = ["gangs", "-n", NAMESPACE, "--kubeconfig", str(self.handle.kubeconfig)]
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "shoalctl",
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), ANSWER_WITHIN)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            out = f"(no answer in {ANSWER_WITHIN} s)\n".encode()
        text = out.decode(errors="replace")
        path = folder / f"{len(self.views) + 1:02d}-{slug}.txt"
        path.write_text(text)
        self.views.append({"moment": moment, "file": str(path.relative_to(self.options.out))})
        self.show(f"$ kubectl shoal gangs -n {NAMESPACE}    # {moment}", text)
        if proc.returncode != 0:
            self.fail(f"kubectl shoal gangs exited {proc.returncode}: {text.strip()}")

    def start_agent(self, node: str) -> None:
        assert self.handle is not None
        cloud = (
            Azure(self.servers, vm_name=node)
            if self.options.cloud == "azure"
            else CLOUDS[self.options.cloud](self.servers)
        )
        self.clouds[node] = cloud
        sock = str(self.socket_path(node))
        Path(sock).parent.mkdir(parents=True, exist_ok=True)
        (port,) = cluster.free_ports(["agent"]).values()
        argv = [
            _python(),
            "-m",
            "nodeagent",
            "--kubeconfig",
            str(self.handle.kubeconfig),
            "--node-name",
            node,
            "--provider",
            self.options.cloud,
            "--metadata-url",
            cloud.url,
            "--socket",
            sock,
            # Each agent keeps its pod file in the demo's folder: the default, /var/lib/shoal-agent,
            # is a real node's hostPath on this machine, and one file is one node's.
            "--state-dir",
            str(self.options.out / "state" / node),
            "--listen",
            f"127.0.0.1:{port}",
            "--gpu",
            "off",
            "--evict-margin",
            str(max(2.0, 15.0 / self.options.compression)),
            "--delete-margin",
            str(max(1.0, 5.0 / self.options.compression)),
            "--log-format",
            "json",
        ]
        proc, _ = process.spawn(
            f"agent-{node}",
            argv,
            self.options.out / "logs" / f"agent-{node}.log",
            die_with_parent=not self.options.keep,
        )
        self.agents[node] = (proc, sock)

    def submit(self, plan: JobPlan) -> None:
        self.jobs[plan.name] = JobState(plan)
        template_spec: dict[str, Any] = {
            "schedulerName": names.SCHEDULER_NAME,
            "restartPolicy": "Never",
            "tolerations": [{"key": names.KWOK_TAINT, "operator": "Exists"}],
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.example.com/trainer:1.0",
                    "resources": {
                        "limits": {names.GPU_RESOURCE: "8"},
                        "requests": {"cpu": "4", "memory": "16Gi"},
                    },
                }
            ],
        }
        if plan.priority_class:
            template_spec["priorityClassName"] = plan.priority_class
        job = {
            "metadata": {"name": plan.name},
            "spec": {
                "completionMode": "Indexed",
                "completions": plan.max,
                "parallelism": plan.max,
                "backoffLimit": 1000,
                "podFailurePolicy": {
                    "rules": [
                        {
                            "action": "Ignore",
                            "onPodConditions": [{"type": "DisruptionTarget"}],
                        }
                    ]
                },
                "template": {
                    "metadata": {
                        "labels": {names.GANG_LABEL: plan.name, "demo.shoal.dev/job": plan.name},
                        "annotations": {
                            names.MIN_MEMBER_ANNOTATION: str(plan.min),
                            names.MAX_MEMBER_ANNOTATION: str(plan.max),
                        },
                    },
                    "spec": template_spec,
                },
            },
        }
        client.BatchV1Api(self.api).create_namespaced_job(NAMESPACE, job)
        self.say(
            f"submitted {plan.name}: gang of {plan.min}..{plan.max} workers x 8 GPUs"
            + (f", priority {plan.priority_class}" if plan.priority_class else "")
        )

    # -- the world as it is ------------------------------------------------------------------
    async def watch(self, stop: asyncio.Event) -> None:
        core = client.CoreV1Api(self.api)
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            items = (await loop.run_in_executor(None, core.list_namespaced_pod, NAMESPACE)).items
            self.observe(items)
            await asyncio.sleep(0.25)

    def observe(self, items: list[Any]) -> None:  # noqa: C901 - one case per kind of thing the story watches
        now = self.now()
        seen: set[str] = set()
        bound: dict[str, int] = dict.fromkeys(self.jobs, 0)
        by_node: dict[str, list[str]] = {}
        for pod in items:
            job = (pod.metadata.labels or {}).get("demo.shoal.dev/job")
            if job not in self.jobs:
                continue
            gone = pod.metadata.deletion_timestamp is not None or pod.status.phase in (
                "Succeeded",
                "Failed",
            )
            if pod.spec.node_name and not gone:
                bound[job] += 1
                by_node.setdefault(pod.spec.node_name, []).append(job)
            uid = pod.metadata.uid
            if gone:
                continue
            seen.add(uid)
            notes = pod.metadata.annotations or {}
            leave_by = notes.get(names.LEAVE_BY_ANNOTATION)
            state = self.pods.get(uid)
            if state is None and pod.status.phase == "Running":
                state = self.joined(PodState(uid, pod.metadata.name, job, pod.spec.node_name, now))
            if state is None:
                continue
            state.progress = decode_or_none(notes.get(names.PROGRESS_ANNOTATION, ""))
            if leave_by and not state.checkpointed:
                self.asked(state, notes.get(names.RECLAIMED_FOR_ANNOTATION))
        for uid in [u for u in self.pods if u not in seen]:
            self.departed(self.pods.pop(uid), now)
        for name, gang in self.jobs.items():
            gang.bound = bound[name]
            if 0 < gang.bound < gang.plan.min:
                gang.partial_since = gang.partial_since or now
                if now - gang.partial_since > 3.0:
                    self.fail(
                        f"{name} has {gang.bound} members bound, below its minimum "
                        f"{gang.plan.min}, for more than 3 s"
                    )
                    gang.partial_since = now
            else:
                gang.partial_since = None
        self.node_pods = by_node
        self.samples.append((now, {j: s.bound * 8 for j, s in self.jobs.items()}))

    def joined(self, pod: PodState) -> PodState:
        """A member runs: its worker starts; after the growth it replaces one that left."""
        self.pods[pod.uid] = pod
        pod.task = asyncio.get_running_loop().create_task(self.worker(pod))
        job = self.jobs[pod.job]
        if job.departures and self.growth_done:
            job.replacement_latency.append(pod.running_since - job.departures.pop(0))
            self.replacements.append((pod.running_since, pod.job, pod.name, pod.node))
            self.say(f"{pod.job}: replacement {pod.name} running on {pod.node}")
        return pod

    def asked(self, pod: PodState, gang: str | None) -> None:
        """``pod`` carries a ``shoal.dev/leave-by`` its worker has not acted on yet: written by
        the scheduler for another gang (a reclaim), for its own (an early warning on its node),
        or by its node agent (a notice)."""
        if gang is None:
            self.checkpoint(pod, "told to leave by its node agent")
        elif gang.rsplit("/", 1)[-1] == pod.job:
            pod.moved = True
            self.checkpoint(pod, "asked to leave by the scheduler: its node is expected to go")
        else:
            pod.reclaimed = True
            self.checkpoint(pod, "asked to leave by the scheduler (reclaim)")

    def departed(self, pod: PodState, now: float) -> None:
        self.gone_at[pod.name] = now
        self.left.append(pod)
        job = self.jobs[pod.job]
        if pod.task is not None:
            pod.task.cancel()
        if job.finished:
            return
        if not pod.reclaimed:  # a reclaimed member is not replaced until room returns
            job.departures.append(now)
        if not pod.checkpointed:
            lost = job.step - job.saved
            job.lost += lost
            job.step = job.saved
            self.fail(
                f"{pod.name} on {pod.node} was killed before it checkpointed "
                f"({lost} steps of {pod.job} lost)"
            )

    def checkpoint(self, pod: PodState, why: str) -> int:
        job = self.jobs[pod.job]
        job.saved = job.step
        job.saved_at = time.time()
        pod.checkpointed = True
        self.say(f"{pod.name} ({why}): checkpoint at step {job.step}")
        return job.step

    async def worker(self, pod: PodState) -> None:
        """One training worker: watches its notices and leaves cleanly when told to."""
        sock = self.agents[pod.node][1] if pod.node in self.agents else ""
        watcher = NoticeClient(PodIdentity(NAMESPACE, pod.name, pod.uid), sock)
        reporting = asyncio.get_running_loop().create_task(self.report(pod, watcher))
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                try:
                    async for notice in watcher.watch():
                        if notice.leave:
                            # Heard, so known even when the pod's shoal.dev/leave-by is gone
                            # before the next listing sees it. A reclaim for its own gang
                            # ("reclaimed for gang training/<job>") moves it off a warned node.
                            if notice.kind == "reclaim":
                                own = notice.reason.endswith(f"/{pod.job}")
                                pod.moved = pod.moved or own
                                pod.reclaimed = pod.reclaimed or not own
                            step = self.checkpoint(
                                pod,
                                f"notice from {notice.source}: leave by {notice.leave_by:%H:%M:%S}",
                            )
                            answer = await watcher.acknowledge(step)
                            self.say(f"{pod.name}: acknowledged step {step} ({answer})")
                            return
                except asyncio.CancelledError:
                    raise
                except Exception:
                    await asyncio.sleep(0.5)
        reporting.cancel()

    async def report(self, pod: PodState, watcher: NoticeClient) -> None:
        """Report the job's last complete checkpoint to the node agent, which writes it on the
        pod (``shoal.dev/progress``): once the job has one, and again after each new one (a
        refused report, before the agent lists the pod, is sent again)."""
        sent: tuple[int, float] | None = None
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                job = self.jobs[pod.job]
                mark = None if job.saved_at is None else (job.saved, job.saved_at)
                if mark is not None and mark != sent:
                    report = Report(
                        max(job.step, job.saved),
                        step_seconds=TICK,
                        checkpoint_step=job.saved,
                        checkpoint_at=mark[1],
                        checkpoint_seconds=TICK,
                    )
                    with contextlib.suppress(Exception):
                        if await watcher.report_progress(report):
                            sent = mark
                await asyncio.sleep(0.5)

    async def train(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(TICK)
            for job in self.jobs.values():
                if job.bound >= job.plan.min:
                    job.step += 1
                if job.bound < job.plan.max:
                    job.below_target_s += TICK

    # -- waiting for the world -----------------------------------------------------------------
    async def until(self, what: str, check: Callable[[], bool], within: float) -> bool:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if check():
                return True
            await asyncio.sleep(0.25)
        self.fail(f"timed out after {within:.0f} s waiting for {what}")
        return False

    def at_max(self, names_: list[str]) -> bool:
        return all(self.jobs[n].bound == self.jobs[n].plan.max for n in names_)

    # -- the story -------------------------------------------------------------------------------
    async def story(self) -> None:
        base, urgent = plans(self.options.nodes)
        names_ = [p.name for p in base]
        for plan in base:
            self.submit(plan)
        if await self.until(
            "every job to be admitted and grown to its maximum", lambda: self.at_max(names_), 180
        ):
            self.say(
                "all jobs admitted at their minimum and grown to their maximum: "
                + ", ".join(f"{n} {self.jobs[n].bound}/{self.jobs[n].plan.max}" for n in names_)
            )
            await self.snapshot("admitted", "every job admitted and grown to its maximum")
        self.growth_done = True
        await asyncio.sleep(3)

        victims = self.pick_victims(2)
        if len(victims) < 2:
            self.fail("no two spot nodes run only surplus workers; nothing to revoke safely")
            return
        moved_at = await self.early_warning(victims[0])
        # The other node's job checkpoints at its notice: well after the moved one's.
        await asyncio.sleep(max(0.0, moved_at + CHECKPOINT_GAP - self.now()))
        lead = 0.0
        at_notice = {node: len(self.node_pods.get(node, [])) for node in victims}
        if at_notice[victims[0]]:
            self.fail(f"{victims[0]} still ran {at_notice[victims[0]]} worker(s) at its notice")
        self.beats["early_warning"].update(
            workers_on_node_at_its_notice=at_notice[victims[0]], notice_at_s=round(self.now(), 1)
        )
        for node in victims:
            lead = self.post_notice(self.clouds[node])
            self.node_state[node] = "revoking"
        self.say(
            f"spot revocation of {', '.join(victims)}: {self.options.cloud} notice with "
            f"{lead:.0f} s lead"
            + (
                f" (the real {lead * self.options.compression:.0f} s, "
                f"compressed {self.options.compression:g}x)"
                if self.options.cloud != "gcp"
                else ""
            )
        )
        await self.until(
            "the revoked nodes' workers to leave",
            lambda: not any(self.node_pods.get(n) for n in victims),
            lead + 30,
        )
        await asyncio.sleep(max(0.0, lead - 1))
        for node in victims:
            self.remove_node(node)
        self.say(f"{', '.join(victims)} revoked by the cloud")
        if await self.until(
            "replacements to bring every job back to its maximum", lambda: self.at_max(names_), 120
        ):
            self.say("replacements placed on the remaining capacity; every job back at maximum")
            await self.snapshot("spot-notice", "after the spot revocation: replacements placed")

        await self.until(
            "every worker's last checkpoint in its shoal.dev/progress", self.progress_written, 60
        )
        saved_at = {n: self.jobs[n].saved_at for n in names_}
        submitted = time.time()
        self.submit(urgent)
        if await self.until(
            f"{urgent.name} to be admitted at its minimum",
            lambda: self.jobs[urgent.name].bound >= urgent.min,
            120,
        ):
            self.say(
                f"{urgent.name} admitted: surplus members of the others reclaimed; "
                + ", ".join(f"{n} {self.jobs[n].bound}/{self.jobs[n].plan.max}" for n in names_)
            )
            await self.snapshot("reclaimed", f"after the reclaim for {urgent.name}")
            await self.least_loss(saved_at, submitted)
        await asyncio.sleep(3)

        self.say("capacity returns: two new spot nodes; the urgent job finishes")
        self.add_nodes(2, prefix="gpu-new")
        self.jobs[urgent.name].finished = True
        client.BatchV1Api(self.api).delete_namespaced_job(
            urgent.name, NAMESPACE, propagation_policy="Background"
        )
        if await self.until("every job to regrow to its maximum", lambda: self.at_max(names_), 180):
            self.say("every job regrown to its maximum")
            await self.snapshot("end", "the end: every job regrown")
        await asyncio.sleep(2)

    async def early_warning(self, node: str) -> float:
        """Warn ``node`` before any notice: an AWS rebalance recommendation (a cordon on the
        other clouds, as a termination handler or an operator does). The scheduler moves its
        surplus workers (each asked to leave for its own gang, at once: no progress reported
        yet), and their replacements run elsewhere. Returns when they left."""
        there = [p for p in self.pods.values() if p.node == node]
        warning = self.warn(node)
        warned_at = self.now()
        self.node_state[node] = "warned"
        self.say(
            f"{warning} on {node}, running {', '.join(p.name for p in there)}: "
            "no termination notice yet"
        )
        jobs = sorted({p.job for p in there})
        await self.until(
            f"the workers of {node} to be moved before any notice",
            lambda: not self.node_pods.get(node) and all(p.name in self.gone_at for p in there),
            60,
        )
        if await self.until(
            "their replacements to run", lambda: self.at_max(jobs) and self._replaced(there), 60
        ):
            self.say(f"{node} emptied before its notice; replacements run on other nodes")
        left = max((self.gone_at.get(p.name, self.now()) for p in there), default=self.now())
        replaced = [r for r in self.replacements if r[0] >= warned_at and r[1] in jobs]
        events: dict[str, str] = {}
        for pod in there:
            if not pod.moved:
                self.fail(f"{pod.name} left {node} without the scheduler asking it to move")
                continue
            events[pod.name] = await self.reclaimed_event(pod.name)
            if f"node {node} is expected to go" not in events[pod.name]:
                self.fail(f"{pod.name}'s Event does not say its node is expected to go")
        for _, job, name, on in replaced:
            if on == node:
                self.fail(f"{job}'s replacement {name} was placed on the warned node {node}")
        self.beats["early_warning"] = {
            "node": node,
            "warning": warning,
            "warned_at_s": round(warned_at, 1),
            "moved": sorted(p.name for p in there if p.moved),
            "left_by_s": round(left, 1),
            "replacements": {name: on for _, _, name, on in replaced},
            "events": events,
        }
        return left

    def _replaced(self, leavers: list[PodState]) -> bool:
        """A replacement runs for each of ``leavers`` (after it left)."""
        for pod in leavers:
            gone = self.gone_at.get(pod.name)
            if gone is None or not any(
                r[1] == pod.job and r[0] >= gone and r[2] != pod.name for r in self.replacements
            ):
                return False
        return True

    def warn(self, node: str) -> str:
        """Give ``node`` an early warning; returns what it was."""
        cloud = self.clouds[node]
        if isinstance(cloud, Aws):
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            server = cloud.server
            self.servers.call(lambda: setattr(server, "rebalance", {"noticeTime": stamp}))
            return "AWS rebalance recommendation"
        client.CoreV1Api(self.api).patch_node(node, {"spec": {"unschedulable": True}})
        return "cordon"

    def progress_written(self) -> bool:
        """Every running worker of a job that has a checkpoint carries it in its
        ``shoal.dev/progress`` (what the scheduler ranks a reclaim's victims by)."""
        for pod in self.pods.values():
            job = self.jobs[pod.job]
            if job.saved_at is None or pod.checkpointed:
                continue
            if pod.progress is None or pod.progress.checkpoint_step != job.saved:
                return False
        return True

    async def least_loss(self, saved_at: dict[str, float | None], submitted: float) -> None:
        """The reclaim took the members whose checkpoint was newest (least expected loss), as
        the scheduler's Reclaimed Event on each says; the figures go to the summary."""
        victims = sorted((p for p in self.all_pods() if p.reclaimed), key=lambda p: (p.job, p.name))
        if not victims:
            self.fail("the urgent job was admitted without a reclaim")
            return
        ages = {
            job: None if at is None else round(submitted - at, 1) for job, at in saved_at.items()
        }
        taken = {p.job for p in victims}
        for job in sorted(taken):
            for other, at in saved_at.items():
                mine = saved_at[job]
                if other not in taken and at is not None and (mine is None or at > mine):
                    self.fail(
                        f"the reclaim took a member of {job} (checkpoint {ages[job]} s old) "
                        f"over {other}, whose checkpoint was newer ({ages[other]} s old)"
                    )
        events: dict[str, str] = {}
        for pod in victims:
            text = await self.reclaimed_event(pod.name)
            events[pod.name] = text
            if "least expected loss" not in text:
                self.fail(f"{pod.name}'s Reclaimed Event does not say it lost the least: {text}")
        self.beats["least_loss"] = {
            "victims": {p.name: p.job for p in victims},
            "checkpoint_age_at_submit_s": ages,
            "reclaimed_events": events,
        }
        took = [f"{p.name} ({p.job}, checkpoint {_age(ages[p.job])})" for p in victims]
        spared = [f"{j} (checkpoint {_age(ages[j])})" for j in ages if j not in taken]
        self.say(f"the reclaim took {', '.join(took)}; spared {', '.join(spared) or 'none'}")

    def all_pods(self) -> list[PodState]:
        """Every worker seen, running or gone."""
        return [*self.pods.values(), *self.left]

    async def reclaimed_event(self, name: str) -> str:
        """The message of the scheduler's ``Reclaimed`` Event on pod ``name`` (it is written
        off the scheduling loop: waited for)."""
        core = client.CoreV1Api(self.api)
        loop = asyncio.get_running_loop()
        selector = f"involvedObject.name={name},reason=Reclaimed"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = await loop.run_in_executor(
                None,
                lambda: core.list_namespaced_event(NAMESPACE, field_selector=selector).items,
            )
            if found:
                return str(found[0].message)
            await asyncio.sleep(0.5)
        self.fail(f"no Reclaimed Event on {name} within 30 s")
        return ""

    def post_notice(self, cloud: Cloud) -> float:
        """Publish a revocation with the cloud's documented lead, compressed; returns the lead.

        GCP's preemption notice carries no time (the agent assumes its documented 30 s)."""
        if not isinstance(cloud, Gcp):
            cloud.renew(cloud.lead / self.options.compression)
        cloud.post()
        return cloud.lead.total_seconds()

    def pick_victims(self, count: int) -> list[str]:
        """Spot nodes running workers whose loss leaves every gang at or above its minimum;
        nodes of different jobs when there are enough (each job then checkpoints once, at a
        moment of its own, before the reclaim)."""
        return self._pick(count, distinct=True) or self._pick(count, distinct=False)

    def _pick(self, count: int, *, distinct: bool) -> list[str]:
        spare = {name: job.bound - job.plan.min for name, job in self.jobs.items()}
        chosen: list[str] = []
        taken: set[str] = set()
        for node, jobs in sorted(self.node_pods.items()):
            if len(chosen) == count:
                break
            if not jobs or self.node_state.get(node) != "ready" or not nodes_spot(self.api, node):
                continue
            if distinct and taken & set(jobs):
                continue
            if all(spare[j] >= jobs.count(j) for j in set(jobs)):
                for j in jobs:
                    spare[j] -= 1
                taken |= set(jobs)
                chosen.append(node)
        return chosen if len(chosen) == count else []

    def remove_node(self, node: str) -> None:
        core = client.CoreV1Api(self.api)
        with contextlib.suppress(client.exceptions.ApiException):
            core.delete_node(node)
        self.node_state[node] = "gone"
        proc, _ = self.agents.pop(node)
        process.stop(proc, grace=5)

    async def run(self, render: Callable[[Demo], None] | None) -> None:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(self.watch(stop)), asyncio.create_task(self.train(stop))]
        if render is not None:
            tasks.append(asyncio.create_task(self._render(render, stop)))
        try:
            await self.story()
        finally:
            stop.set()
            for pod in self.pods.values():
                if pod.task is not None:
                    pod.task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _render(self, render: Callable[[Demo], None], stop: asyncio.Event) -> None:
        while not stop.is_set():
            render(self)
            await asyncio.sleep(0.5)

    def shutdown(self) -> None:
        if self.options.keep:
            return
        for proc, _ in self.agents.values():
            process.stop(proc, grace=3)
        for proc in self.procs:
            process.stop(proc, grace=5)
        self.servers.close()
        if self.api is not None:
            self.api.close()
        if self.handle is not None:
            cluster.down(self.run_dir, say=lambda _m: None)


def _age(seconds: float | None) -> str:
    return "none" if seconds is None else f"{seconds} s old"


def nodes_spot(api: Any, node: str) -> bool:
    labels = client.CoreV1Api(api).read_node(node).metadata.labels or {}
    return names.is_spot(labels)


def _python() -> str:
    import sys

    return sys.executable


def summary_rows(demo: Demo) -> list[dict[str, Any]]:
    rows = []
    for name, job in demo.jobs.items():
        latencies = sorted(job.replacement_latency)
        rows.append(
            {
                "job": name,
                "min": job.plan.min,
                "max": job.plan.max,
                "steps": job.step,
                "steps_lost": job.lost,
                "time_below_target_s": round(job.below_target_s, 1),
                "replacements": len(latencies),
                "replacement_latency_p50_s": round(latencies[len(latencies) // 2], 2)
                if latencies
                else None,
                "replacement_latency_max_s": round(latencies[-1], 2) if latencies else None,
            }
        )
    return rows
