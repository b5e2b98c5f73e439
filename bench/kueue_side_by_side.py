"""Side by side under the real Kueue: Kueue + Shoal, and Kueue + kube-scheduler's own gangs.

One devcluster (kwok nodes of 8 GPUs, Kubernetes' workload scheduling APIs on: ``GenericWorkload``
and ``scheduling.k8s.io/v1beta1``, so kube-scheduler's default profile gang-schedules
``scheduling.k8s.io`` PodGroups) with Kueue built from its pinned module and run as the
integration tests run it (``tests/integration/kueue.py``: its release objects, its webhooks
through a network namespace of the harness's own, which needs root). Each arm, one after the
other on the same nodes, gets a fresh namespace that Kueue manages, fresh queues and the very
same submission schedule:

- *shoal*: the pods name ``shoal-bench`` as their scheduler and carry only Kueue's pod-group
  label and count, which Shoal reads as one gang (``docs/kueue.md``);
- *kube-scheduler*: the pods name ``default-scheduler``, and each pod group also gets a
  ``scheduling.k8s.io`` PodGroup (``schedulingPolicy.gang.minCount`` = its size) that its pods
  name in ``spec.schedulingGroup`` (one PodGroup per attempt, below).

The workload: two teams, two ClusterQueues in one cohort over one ResourceFlavor (the bench's
nodes). The lender's nominal GPU quota is half the GPUs, with ``reclaimWithinCohort: Any``; the
borrower's is the other half, with no borrowing limit. Every job is a plain Kueue pod group (pods
labelled ``kueue.x-k8s.io/pod-group-name``, annotated ``kueue.x-k8s.io/pod-group-total-count``,
queued with ``kueue.x-k8s.io/queue-name``) of 2 to 8 pods of 2, 4 or 8 GPUs. The borrower comes
first and borrows all of the lender's idle quota; the lender's jobs come later, and Kueue
preempts borrowed jobs to give the lender its quota back (``InCohortReclamation``). With more
than 8 nodes the schedule is repeated once per 8 nodes (same times; the quotas grow with the
GPUs). Elastic PyTorchJobs are left out: they need the training-operator, and Kueue admits a
PyTorchJob for all its replicas anyway (``docs/kueue.md``).

The bench is the jobs' controller, the same in both arms: it creates each job's pods at its
time; once all of them are bound, the job runs for its duration and the bench marks every pod
``Succeeded`` (Kueue then releases the quota). A job that loses a member first (Kueue's
preemption deletes its pods; Kueue does not recreate plain pods) starts over from nothing: the
bench deletes what is left of that attempt and, once Kueue no longer counts any of its pods,
creates a fresh set (a new attempt). kwok's pods never finish on their own.

Measured per arm, from every version of the pods a watch recorded (``tests/integration/
history.py``), with the time this process received it:

- submission to all-bound, per job (its first attempt): the job's pods created to every one of
  them bound at once; Kueue's queueing is part of it, the same for both schedulers. Beside it,
  admitted to all-bound (every attempt): the last of an attempt's scheduling gates removed by
  Kueue to all its pods bound, the scheduler's own share;
- GPUs held while jobs wait: GPU-seconds held by bound members of gangs that are not whole yet
  (from each member's binding until the last member is bound, or until it goes if the gang is
  never whole), and the longest one gang held GPUs that way;
- partial gangs: attempts that had members bound but never all of them at once (the same
  check as ``kueue.partly_bound`` in the integration tests, given that each pod is bound at
  most once: a gang that rose straight to whole and fell straight to none is not partial). It
  must be 0 for Shoal;
- work lost to preemption, as a proxy: every pod that stopped holding its GPUs while bound and
  before its job finished (Kueue's preemption deletes it; any other eviction counts too, under
  its own reason), and the GPU-seconds it had been bound (bound time x GPUs). Checkpoints are
  not modelled: a job that loses a member restarts from nothing;
- Kueue's side: its preemptions by reason, the borrower's peak borrowed GPUs (from the
  ClusterQueues' status), so a run shows the borrowing and the reclaim happened; the makespan,
  the share of the GPUs' time held by whole gangs, and the scheduler process's CPU seconds.

Prints a table with the ratio Shoal / kube-scheduler, one with each job's submission to
all-bound, and writes JSON to ``--out`` (after each arm); it is a measurement, not a test. It
runs as root (Kueue's webhook network, as the Kueue tests); every process it starts dies with
it, and everything it made goes with the devcluster at the end. The exit status is 1 when an
arm did not finish in ``--timeout`` or Shoal left a gang partial.

    .venv/bin/python bench/kueue_side_by_side.py --nodes 8 --out bench-out

``--time-scale 0.5`` halves every submission time and run duration (a quicker pass).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shlex
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from contracts import names
from devcluster import build, cluster, process
from scheduler import settings
from tests.integration import kueue
from tests.integration.conftest import Devcluster
from tests.integration.history import History, State
from tests.integration.reliability.owncluster import own_devcluster
from tests.integration.scheduler.conftest import TEST_LABEL, Pods, Pool, SchedulerProcess
from tests.waiting import eventually, poll

LENDER: Final = "lender"
BORROWER: Final = "borrower"
GPUS_PER_NODE: Final = 8
#: The schedule below is written for this many nodes; more nodes repeat it.
NODES_PER_COPY: Final = 8
SCHEDULER_NAMES: Final = {"kube-scheduler": "default-scheduler", "shoal": "shoal-bench"}
PODGROUPS: Final = ("scheduling.k8s.io", "v1beta1", "podgroups")
#: The pod condition Kueue writes just before it deletes a pod of a workload it evicts; its
#: reason is ``WorkloadEvictedDueTo<the Workload's Evicted reason>``.
TERMINATION_TARGET: Final = "TerminationTarget"
KUEUE_STOP_PREFIX: Final = "WorkloadEvictedDueTo"
#: How often the bench, as the jobs' controller, looks at the latest state of the pods.
TICK: Final = 0.2


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job: ``pods`` pods of ``gpus`` GPUs, one Kueue pod group (one gang), submitted ``at``
    seconds after its arm starts; it finishes once it has run ``runs`` seconds whole."""

    name: str
    team: str
    at: float
    pods: int
    gpus: int
    runs: float


#: For 8 nodes of 8 GPUs (64; each team's nominal quota 32). The borrower fills its quota and
#: borrows all of the lender's (b1-b3; b4 waits); a1 and a2 each take 16 GPUs back (Kueue
#: preempts the borrowed jobs b3, then b2, which start over); the rest queue behind them.
SCHEDULE: Final = (
    JobSpec("b1", BORROWER, 0, 4, 8, 90),
    JobSpec("b2", BORROWER, 2, 2, 8, 75),
    JobSpec("b3", BORROWER, 4, 4, 4, 75),
    JobSpec("b4", BORROWER, 6, 8, 2, 30),
    JobSpec("a1", LENDER, 30, 2, 8, 45),
    JobSpec("a2", LENDER, 40, 4, 4, 45),
    JobSpec("a3", LENDER, 50, 3, 8, 30),
    JobSpec("b5", BORROWER, 60, 6, 4, 30),
    JobSpec("a4", LENDER, 80, 8, 2, 30),
    JobSpec("b6", BORROWER, 100, 2, 4, 30),
    JobSpec("a5", LENDER, 120, 2, 8, 30),
    JobSpec("b7", BORROWER, 140, 5, 8, 30),
)


def schedule(copies: int, time_scale: float) -> list[JobSpec]:
    """The schedule, ``copies`` times (the copies' jobs are suffixed ``c2``, ``c3``...), with
    every time and duration multiplied by ``time_scale``."""
    return [
        JobSpec(
            job.name if copy == 1 else f"{job.name}c{copy}",
            job.team,
            job.at * time_scale,
            job.pods,
            job.gpus,
            job.runs * time_scale,
        )
        for copy in range(1, copies + 1)
        for job in SCHEDULE
    ]


# -- The jobs' controller ---------------------------------------------------------------------


@dataclass
class Attempt:
    """One set of a job's pods, created together (a preempted job's next set is a new one)."""

    created: float
    pods: list[str]


@dataclass
class JobRun:
    spec: JobSpec
    attempts: list[Attempt] = field(default_factory=list)
    #: The pods the watch has shown (one missing from the latest state since has gone).
    seen: set[str] = field(default_factory=set)
    next_index: int = 0
    whole_since: float | None = None
    restarting: bool = False
    finished_at: float | None = None


def _phase(pod: Any) -> str | None:
    return pod.status.phase if pod.status is not None else None


def pod_body(pods: Pods, job: JobSpec, name: str, pod_group: str | None) -> dict[str, Any]:
    """A member of the job's Kueue pod group; ``pod_group`` also names a Kubernetes PodGroup
    (``spec.schedulingGroup``), for kube-scheduler's own gang scheduling."""
    spec = kueue.worker(pods, job.gpus)
    if pod_group is not None:
        spec["schedulingGroup"] = {"podGroupName": pod_group}
    return {
        "metadata": {
            "name": name,
            "labels": {kueue.QUEUE_LABEL: job.team, kueue.POD_GROUP_LABEL: job.name},
            "annotations": {kueue.POD_GROUP_TOTAL_ANNOTATION: str(job.pods)},
        },
        "spec": spec,
    }


def pod_group_body(name: str, members: int) -> dict[str, Any]:
    """A ``scheduling.k8s.io`` PodGroup that kube-scheduler gang-schedules (as bench/compare.py
    makes them)."""
    return {
        "apiVersion": f"{PODGROUPS[0]}/{PODGROUPS[1]}",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"schedulingPolicy": {"gang": {"minCount": members}}},
    }


@dataclass
class Driver:
    """What a job controller does for the arm's jobs, from the latest state of its pods: create
    each job's pods at its time, finish a job once it has run whole for its duration, and start
    a job over once it lost a member. ``kube_groups``: each attempt also gets a Kubernetes
    PodGroup (kube-scheduler's arm); a fresh one per attempt, since kube-scheduler may treat a
    group it already placed as done."""

    pods: Pods
    kube_groups: bool
    started: float
    runs: list[JobRun]

    def done(self) -> bool:
        return all(run.finished_at is not None for run in self.runs)

    def tick(self, latest: State, now: float) -> None:
        for run in self.runs:
            if run.finished_at is None:
                self._step(run, latest, now)

    def _step(self, run: JobRun, latest: State, now: float) -> None:
        if not run.attempts:
            if now >= self.started + run.spec.at:
                self._start(run, now)
            return
        members = run.attempts[-1].pods
        run.seen.update(name for name in members if name in latest)
        if run.restarting or any(self._going(run, latest, name) for name in members):
            self._restart(run, latest, now)
        elif all(name in latest and kueue.holds(latest[name]) for name in members):
            if run.whole_since is None:
                run.whole_since = now
            # Running too: kwok makes a bound pod Running 1-6 s later, and a Succeeded written
            # before that would be overwritten.
            running = all(_phase(latest[name]) == "Running" for name in members)
            if running and now - run.whole_since >= run.spec.runs:
                self._finish(run, now)
        else:
            run.whole_since = None

    @staticmethod
    def _going(run: JobRun, latest: State, name: str) -> bool:
        """Deleted, being deleted, or failed."""
        pod = latest.get(name)
        if pod is None:
            return name in run.seen
        return pod.metadata.deletion_timestamp is not None or _phase(pod) == "Failed"

    @staticmethod
    def _dead(run: JobRun, latest: State, name: str) -> bool:
        """Gone as Kueue counts a group's pods (``isPodRunnableOrSucceeded``): a pod that is
        still bound while it is deleted counts until it has failed. A new set made before then
        would be more pods than the group's count, and Kueue deletes the excess."""
        pod = latest.get(name)
        if pod is None:
            return name in run.seen
        deleting = pod.metadata.deletion_timestamp is not None
        return _phase(pod) == "Failed" or (deleting and not pod.spec.node_name)

    def _start(self, run: JobRun, now: float) -> None:
        job = run.spec
        members = [f"{job.name}-{run.next_index + i}" for i in range(job.pods)]
        run.next_index += job.pods
        pod_group = f"{job.name}-a{len(run.attempts)}" if self.kube_groups else None
        namespace = self.pods.namespace
        if pod_group is not None:
            client.CustomObjectsApi(self.pods.devcluster.api).create_namespaced_custom_object(
                *PODGROUPS[:2], namespace, PODGROUPS[2], pod_group_body(pod_group, job.pods)
            )
        run.attempts.append(Attempt(created=now, pods=members))
        core = self.pods.devcluster.core()
        for name in members:
            core.create_namespaced_pod(namespace, pod_body(self.pods, job, name, pod_group))

    def _restart(self, run: JobRun, latest: State, now: float) -> None:
        """A job that lost a member restarts whole: what is left of the attempt is deleted (at
        each look until the watch shows it going, a member it shows only now included), and
        once none of its pods counts for Kueue any more, a new set is made."""
        members = run.attempts[-1].pods
        run.restarting, run.whole_since = True, None
        for name in members:
            if name in latest and not self._going(run, latest, name):
                self._delete(name)
        if all(self._dead(run, latest, name) for name in members):
            run.restarting = False
            self._start(run, now)

    def _delete(self, name: str) -> None:
        try:
            self.pods.devcluster.core().delete_namespaced_pod(
                name, self.pods.namespace, grace_period_seconds=0
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _finish(self, run: JobRun, now: float) -> None:
        """Every member ``Succeeded``, as a kubelet reports a finished container (kwok's pods
        never finish on their own); Kueue then counts the group finished and frees its quota."""
        run.finished_at = now
        core = self.pods.devcluster.core()
        for name in run.attempts[-1].pods:
            try:
                core.patch_namespaced_pod_status(
                    name, self.pods.namespace, {"status": {"phase": "Succeeded"}}
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise


def drive(driver: Driver, history: History, timeout: float) -> bool:
    """Run the jobs' controller until every job finished (True) or ``timeout`` s passed."""
    deadline = driver.started + timeout
    while time.monotonic() < deadline:
        driver.tick(history.states()[-1], time.monotonic())
        if driver.done():
            return True
        time.sleep(TICK)
    return False


# -- What the watches recorded ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Span:
    """One pod's time holding its GPUs: from its binding until it stopped holding them
    (``kueue.holds``: finished or being deleted), or the end of the run. ``lost``: why it
    stopped before its job finished ('' when it did not)."""

    gpus: int
    start: float
    end: float
    lost: str


def _bound(pod: Any) -> bool:
    return bool(pod.spec.node_name)


def _released(pod: Any) -> bool:
    return bool(pod.spec.node_name) and not kueue.holds(pod)


def _ungated(pod: Any) -> bool:
    return not pod.spec.scheduling_gates


def _why_lost(versions: Sequence[Any]) -> str:
    """Why a pod that stopped holding its GPUs went, '' if it finished: Kueue's stop reason
    (``kueue Preempted``...), a disruption's reason, or ``deleted``."""
    if any(_phase(pod) == "Succeeded" for pod in versions):
        return ""
    conditions = [
        c for pod in versions if pod.status is not None for c in pod.status.conditions or []
    ]
    for c in reversed(conditions):
        if c.type == TERMINATION_TARGET and c.status == "True":
            return f"kueue {(c.reason or '').removeprefix(KUEUE_STOP_PREFIX)}"
        if c.type == "DisruptionTarget" and c.status == "True":
            return str(c.reason or c.type)
    return "deleted"


def spans(history: History, pods: Sequence[str], end_of_run: float) -> dict[str, Span]:
    """Each of ``pods`` that was ever bound, as a :class:`Span`."""
    found: dict[str, Span] = {}
    for name in pods:
        start = history.when(name, _bound)
        if start is None:
            continue
        stop = history.when(name, _released)
        versions = history.versions(name)
        found[name] = Span(
            gpus=kueue.gpus_of(versions[-1]),
            start=start,
            end=end_of_run if stop is None else stop,
            lost="" if stop is None else _why_lost(versions),
        )
    return found


@dataclass(frozen=True, slots=True)
class AttemptResult:
    job: str
    index: int
    #: When every member was first bound at once, after the attempt's pods were created.
    to_all_bound_s: float | None
    #: From Kueue's removing the last scheduling gate to every member bound.
    admitted_to_all_bound_s: float | None
    whole_gpu_s: float
    waiting_gpu_s: float
    longest_partial_s: float
    partial: bool
    lost_pods: dict[str, int]
    lost_gpu_s: dict[str, float]


def attempt_result(
    job: str, index: int, attempt: Attempt, found: dict[str, Span], history: History
) -> AttemptResult:
    """What one attempt's spans say: whole from the last member's binding to the first
    member's release (each member is bound once), holding GPUs before that while not whole."""
    own = [found[name] for name in attempt.pods if name in found]
    whole: tuple[float, float] | None = None
    if own and len(own) == len(attempt.pods):
        first_out = min(s.end for s in own)
        last_in = max(s.start for s in own)
        whole = (last_in, first_out) if last_in < first_out else None
    waiting_until = whole[0] if whole else math.inf
    ungated = [t for t in (history.when(name, _ungated) for name in attempt.pods) if t is not None]
    admitted = max(ungated) if ungated and len(ungated) == len(attempt.pods) else None
    lost_pods: Counter[str] = Counter()
    lost_gpu_s: defaultdict[str, float] = defaultdict(float)
    for s in own:
        if s.lost:
            lost_pods[s.lost] += 1
            lost_gpu_s[s.lost] += s.gpus * (s.end - s.start)
    start = min((s.start for s in own), default=0.0)
    return AttemptResult(
        job=job,
        index=index,
        to_all_bound_s=None if whole is None else whole[0] - attempt.created,
        admitted_to_all_bound_s=(
            None if whole is None or admitted is None else max(0.0, whole[0] - admitted)
        ),
        whole_gpu_s=0.0 if whole is None else sum(s.gpus for s in own) * (whole[1] - whole[0]),
        waiting_gpu_s=sum(s.gpus * (min(s.end, waiting_until) - s.start) for s in own),
        longest_partial_s=(
            0.0 if not own else (whole[0] if whole else max(s.end for s in own)) - start
        ),
        partial=bool(own) and whole is None,
        lost_pods=dict(lost_pods),
        lost_gpu_s=dict(lost_gpu_s),
    )


def kueue_preemptions(history: History) -> dict[str, int]:
    """Each time a Workload was ``Preempted``, counted by the condition's reason."""
    seen: dict[tuple[str, str], str] = {}
    for state in history.states():
        for name, workload in state.items():
            found = kueue.condition(workload, "Preempted")
            if found is not None and found["status"] == "True":
                key = (name, str(found.get("lastTransitionTime")))
                seen.setdefault(key, str(found.get("reason") or ""))
    return dict(Counter(seen.values()))


def borrowed_peak(history: History, queue: str) -> int:
    return max(
        (kueue.borrowed_gpus(state[queue]) for state in history.states() if queue in state),
        default=0,
    )


def _pct(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank percentile, rounded; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, math.ceil(len(ordered) * p / 100) - 1))], 2)


def summarize(
    kind: str,
    runs: Sequence[JobRun],
    attempts: Sequence[AttemptResult],
    *,
    started: float,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """The arm's figures (``extra``: what the arm measured besides the attempts; its ``gpus``
    is the cluster's)."""
    first = [a.to_all_bound_s for a in attempts if a.index == 0 and a.to_all_bound_s is not None]
    admitted = [
        a.admitted_to_all_bound_s for a in attempts if a.admitted_to_all_bound_s is not None
    ]
    lost_pods: Counter[str] = Counter()
    lost_gpu_s: defaultdict[str, float] = defaultdict(float)
    for a in attempts:
        lost_pods.update(a.lost_pods)
        for reason, gpu_s in a.lost_gpu_s.items():
            lost_gpu_s[reason] += gpu_s
    ends = [r.finished_at for r in runs if r.finished_at is not None]
    makespan = max(ends) - started if ends else None
    whole = sum(a.whole_gpu_s for a in attempts)
    return {
        "scheduler": kind,
        "jobs": len(runs),
        "jobs_finished": len(ends),
        "attempts": len(attempts),
        "to_all_bound_p50_s": _pct(first, 50),
        "to_all_bound_p90_s": _pct(first, 90),
        "to_all_bound_max_s": _pct(first, 100),
        "admitted_to_all_bound_p50_s": _pct(admitted, 50),
        "admitted_to_all_bound_max_s": _pct(admitted, 100),
        "waiting_gpu_s": round(sum(a.waiting_gpu_s for a in attempts), 1),
        "longest_partial_s": round(max((a.longest_partial_s for a in attempts), default=0.0), 2),
        "partial_gangs": sum(1 for a in attempts if a.partial),
        "lost_pods": sum(lost_pods.values()),
        "lost_gpu_s": round(sum(lost_gpu_s.values()), 1),
        "lost_by_reason": {k: [lost_pods[k], round(v, 1)] for k, v in lost_gpu_s.items()},
        "makespan_s": None if makespan is None else round(makespan, 1),
        "whole_gpu_share": (None if not makespan else round(whole / (extra["gpus"] * makespan), 3)),
        **extra,
        "per_job": {
            r.spec.name: [
                None if a.to_all_bound_s is None else round(a.to_all_bound_s, 2)
                for a in attempts
                if a.job == r.spec.name
            ]
            for r in runs
        },
    }


# -- One arm ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bench:
    devcluster: Devcluster
    pool: Pool
    gpus: int
    logs: Path
    args: argparse.Namespace


def _make_queues(queues: kueue.Queues, gpus: int) -> None:
    """The lender (half the GPUs, takes them back from borrowers) and the borrower (the other
    half, no borrowing limit), in one cohort of their own; then until Kueue says both are
    active."""
    cohort = f"co-{queues.namespace}"
    lent = gpus // 2
    queues.make(lent, local=LENDER, cohort=cohort, preemption={"reclaimWithinCohort": "Any"})
    queues.make(gpus - lent, local=BORROWER, cohort=cohort)
    custom = kueue.custom(queues.devcluster)

    def active() -> bool:
        for name in queues.cluster_queues.values():
            found = kueue.condition(
                custom.get_cluster_custom_object(kueue.GROUP, kueue.VERSION, "clusterqueues", name),
                "Active",
            )
            if found is None or found["status"] != "True":
                return False
        return True

    eventually(active, what="the ClusterQueues to be active")


def _drop_namespace(devcluster: Devcluster, namespace: str) -> None:
    """Delete the namespace and wait until it is gone, so that the next arm starts on empty
    nodes. Kueue finalizes its pods and Workloads; what it has not finalized in three minutes
    is finalized here."""
    core = devcluster.core()
    core.delete_namespace(namespace)

    def gone() -> bool:
        try:
            core.read_namespace(namespace)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    if poll(gone, timeout=180, interval=1):
        return
    unfinalized = {"metadata": {"finalizers": None}}
    for pod in core.list_namespaced_pod(namespace).items:
        with contextlib.suppress(ApiException):
            core.patch_namespaced_pod(pod.metadata.name, namespace, unfinalized)
    custom = kueue.custom(devcluster)
    for workload in kueue.workloads(devcluster, namespace):
        with contextlib.suppress(ApiException):
            custom.patch_namespaced_custom_object(
                kueue.GROUP,
                kueue.VERSION,
                namespace,
                "workloads",
                workload["metadata"]["name"],
                unfinalized,
            )
    eventually(gone, timeout=120, interval=1, what=f"the namespace {namespace} to go")


def _shoal(bench: Bench) -> SchedulerProcess:
    """Shoal as the tests start it, with its own default backoff (the tests' harness lowers it
    to 2 s; kube-scheduler's is 10 s too) and the same client limits as kube-scheduler."""
    backoff = next(o.default for o in settings.OPTIONS if o.name == "max-backoff")
    args = bench.args
    extra = ["--max-backoff", str(backoff), "--qps", str(args.qps), "--burst", str(args.burst)]
    shoal = SchedulerProcess(
        bench.devcluster.kubeconfig,
        SCHEDULER_NAMES["shoal"],
        bench.logs,
        extra=[*extra, *shlex.split(args.shoal_args)],
    )
    return shoal.start()


def run_arm(kind: str, bench: Bench, jobs: Sequence[JobSpec]) -> dict[str, Any]:
    """One arm: a fresh namespace and queues, the scheduler under test, the schedule, the
    measurement; then everything of the arm is deleted."""
    devcluster = bench.devcluster
    namespace = f"{kind.partition('-')[0]}-{uuid.uuid4().hex[:6]}"
    core, custom = devcluster.core(), kueue.custom(devcluster)
    core.create_namespace(
        {"metadata": {"name": namespace, "labels": {kueue.MANAGED_LABEL: "true"}}}
    )
    queues = kueue.Queues(devcluster, namespace, bench.pool)
    with contextlib.ExitStack() as stack:
        stack.callback(queues.delete)
        stack.callback(_drop_namespace, devcluster, namespace)
        _make_queues(queues, bench.gpus)
        pod_history = History(core.list_namespaced_pod, namespace)
        stack.callback(pod_history.close)
        workload_history = History(
            custom.list_namespaced_custom_object, kueue.GROUP, kueue.VERSION, namespace, "workloads"
        )
        stack.callback(workload_history.close)
        queue_history = History(
            custom.list_cluster_custom_object, kueue.GROUP, kueue.VERSION, "clusterqueues"
        )
        stack.callback(queue_history.close)
        if kind == "shoal":
            shoal = _shoal(bench)
            stack.callback(shoal.stop)
            assert shoal.proc is not None
            pid = shoal.proc.pid
        else:
            pid = next(p.pid for p in devcluster.handle.procs if p.name == "kube-scheduler")
        pods = Pods(devcluster, namespace, SCHEDULER_NAMES[kind], bench.pool.pool)
        cpu = process.cpu_seconds(pid)
        print(f"{kind}: namespace {namespace}, {len(jobs)} jobs", flush=True)
        runs = [JobRun(job) for job in jobs]
        driver = Driver(
            pods, kube_groups=kind == "kube-scheduler", started=time.monotonic(), runs=runs
        )
        finished = drive(driver, pod_history, bench.args.timeout)
        end_of_run = time.monotonic()
        cpu = process.cpu_seconds(pid) - cpu
        pod_history.caught_up()
        attempts = _attempts(runs, pod_history, end_of_run)
        result = summarize(
            kind,
            runs,
            attempts,
            started=driver.started,
            extra={
                "finished": finished,
                "nodes": bench.args.nodes,
                "gpus": bench.gpus,
                "kueue_preemptions": kueue_preemptions(workload_history),
                "borrower_borrowed_peak_gpus": borrowed_peak(
                    queue_history, queues.cluster_queues[BORROWER]
                ),
                "lender_borrowed_peak_gpus": borrowed_peak(
                    queue_history, queues.cluster_queues[LENDER]
                ),
                "scheduler_cpu_s": round(cpu, 1),
            },
        )
    return result


def _attempts(runs: Sequence[JobRun], history: History, end_of_run: float) -> list[AttemptResult]:
    every = [name for run in runs for attempt in run.attempts for name in attempt.pods]
    found = spans(history, every, end_of_run)
    return [
        attempt_result(run.spec.name, index, attempt, found, history)
        for run in runs
        for index, attempt in enumerate(run.attempts)
    ]


# -- The devcluster, Kueue and the report -----------------------------------------------------


def _nodes_ready(devcluster: Devcluster, pool: Pool) -> bool:
    """Every node of the pool Ready, with no taint but kwok's own."""
    found = devcluster.core().list_node(label_selector=f"{TEST_LABEL}={pool.pool}").items
    if len(found) != len(pool.created):
        return False
    for node in found:
        ready = [c for c in node.status.conditions or [] if c.type == "Ready"]
        taints = [t for t in node.spec.taints or [] if t.key != names.KWOK_TAINT]
        if not ready or ready[0].status != "True" or taints:
            return False
    return True


def run(
    args: argparse.Namespace,
    arms: Sequence[str],
    jobs: Sequence[JobSpec],
    record: Callable[[list[dict[str, Any]]], None],
) -> list[dict[str, Any]]:
    """Start the devcluster, Kueue and the nodes; run each arm in turn (``record`` gets the
    results so far after each); tear everything down."""
    work = Path(tempfile.mkdtemp(prefix="shoal-kueue-bench-"))
    bin_dir = build.build()
    options = cluster.Options(
        die_with_parent=True,
        kube_scheduler=True,
        scheduler_qps=int(args.qps),
        scheduler_burst=args.burst,
        feature_gates=cluster.WORKLOAD_GATES,
        runtime_config=cluster.WORKLOAD_RUNTIME_CONFIG,
    )
    results: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        network = kueue.WebhookNetwork().create()
        stack.callback(network.delete)
        devcluster = stack.enter_context(
            contextlib.contextmanager(own_devcluster)(work / "devcluster", bin_dir, options)
        )
        (work / "kueue").mkdir()
        running = kueue.Kueue(devcluster, network, bin_dir / "kubectl", work / "kueue")
        stack.callback(running.stop)
        running.start()
        pool = Pool(devcluster, f"p{uuid.uuid4().hex[:6]}")
        pool.add(args.nodes, gpus=GPUS_PER_NODE)
        eventually(lambda: _nodes_ready(devcluster, pool), what="the nodes to be Ready")
        logs = work / "schedulers"
        logs.mkdir()
        bench = Bench(devcluster, pool, args.nodes * GPUS_PER_NODE, logs, args)
        for kind in arms:
            result = run_arm(kind, bench, jobs)
            print(json.dumps(result), flush=True)
            results.append(result)
            record(results)
    print(f"logs: {work}", flush=True)
    return results


ROWS: Final = (
    ("jobs finished", "jobs_finished"),
    ("attempts (a preempted job starts over)", "attempts"),
    ("submission to all-bound p50 s", "to_all_bound_p50_s"),
    ("submission to all-bound p90 s", "to_all_bound_p90_s"),
    ("submission to all-bound max s", "to_all_bound_max_s"),
    ("admitted to all-bound p50 s", "admitted_to_all_bound_p50_s"),
    ("admitted to all-bound max s", "admitted_to_all_bound_max_s"),
    ("GPU-s held by gangs not yet whole", "waiting_gpu_s"),
    ("longest a gang held GPUs not whole s", "longest_partial_s"),
    ("partial gangs", "partial_gangs"),
    ("pods lost before their job finished", "lost_pods"),
    ("GPU-s lost (bound time x GPUs)", "lost_gpu_s"),
    ("borrower's peak borrowed GPUs", "borrower_borrowed_peak_gpus"),
    ("makespan s", "makespan_s"),
    ("share of GPU time held by whole gangs", "whole_gpu_share"),
    ("scheduler CPU s", "scheduler_cpu_s"),
)


def _ratio(shoal: Any, kube: Any) -> str:
    if isinstance(shoal, int | float) and isinstance(kube, int | float) and kube:
        return f"{shoal / kube:.2f}x"
    return "-"


def table(results: Sequence[dict[str, Any]]) -> str:
    """Metric by metric, each arm's value and Shoal / kube-scheduler."""
    by = {r["scheduler"]: r for r in results}
    kinds = [k for k in SCHEDULER_NAMES if k in by]
    lines = [
        "| metric | " + " | ".join(kinds) + " | shoal / kube-scheduler |",
        "|---|" + "---|" * (len(kinds) + 1),
    ]
    for label, key in ROWS:
        values = [by[k].get(key) for k in kinds]
        ratio = (
            _ratio(by["shoal"].get(key), by["kube-scheduler"].get(key)) if len(kinds) == 2 else "-"
        )
        shown = ["-" if v is None else str(v) for v in values]
        lines.append(f"| {label} | " + " | ".join(shown) + f" | {ratio} |")
    for k in kinds:
        lines.append(
            f"\n{k}: Kueue preemptions {by[k]['kueue_preemptions']}, lost by reason (pods, GPU-s) "
            f"{by[k]['lost_by_reason']}, finished in time: {by[k]['finished']}"
        )
    return "\n".join(lines)


def job_table(jobs: Sequence[JobSpec], results: Sequence[dict[str, Any]]) -> str:
    """Each job's submission to all-bound, every attempt, in each arm."""
    by = {r["scheduler"]: r for r in results}
    kinds = [k for k in SCHEDULER_NAMES if k in by]
    lines = [
        "| job | team | pods x GPUs | at s | " + " | ".join(f"{k} s" for k in kinds) + " |",
        "|---|---|---|---|" + "---|" * len(kinds),
    ]
    for job in jobs:
        cells = [", ".join(str(t) for t in by[k]["per_job"][job.name]) or "-" for k in kinds]
        lines.append(
            f"| {job.name} | {job.team} | {job.pods} x {job.gpus} | {job.at:g} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=NODES_PER_COPY, help="kwok nodes of 8 GPUs")
    p.add_argument("--arms", default="kube-scheduler,shoal", help="in this order")
    p.add_argument(
        "--time-scale", type=float, default=1.0, help="multiply submission times and durations"
    )
    p.add_argument("--timeout", type=float, default=1200, help="seconds per arm")
    p.add_argument("--qps", type=float, default=200, help="client QPS of both schedulers")
    p.add_argument("--burst", type=int, default=400, help="client burst of both schedulers")
    p.add_argument("--shoal-args", default="", help="more flags for Shoal, e.g. '--reclaim=false'")
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    args = p.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if unknown := [a for a in arms if a not in SCHEDULER_NAMES]:
        p.error(f"unknown arm(s) {unknown}; choose from {sorted(SCHEDULER_NAMES)}")
    if args.nodes < 1:
        p.error("--nodes must be at least 1")
    if args.qps <= 0 or args.time_scale <= 0:
        p.error("--qps and --time-scale must be positive")
    reason = kueue.unavailable()
    if reason is not None:
        raise SystemExit(f"cannot run the real Kueue here: {reason}")
    jobs = schedule(max(1, args.nodes // NODES_PER_COPY), args.time_scale)
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"kueue-side-by-side-{args.nodes}.json"
    document = {
        "nodes": args.nodes,
        "gpus_per_node": GPUS_PER_NODE,
        "time_scale": args.time_scale,
        "qps": args.qps,
        "burst": args.burst,
        "shoal_args": args.shoal_args,
        "jobs": [asdict(job) for job in jobs],
    }

    def record(results: list[dict[str, Any]]) -> None:
        out.write_text(json.dumps({**document, "results": results}, indent=2) + "\n")

    results = run(args, arms, jobs, record)
    print(table(results))
    print()
    print(job_table(jobs, results))
    print(f"results: {out}")
    shoal_whole = all(r["partial_gangs"] == 0 for r in results if r["scheduler"] == "shoal")
    return 0 if shoal_whole and all(r["finished"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
