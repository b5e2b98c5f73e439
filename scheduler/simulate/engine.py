"""The simulation: a virtual clock, the live scheduling core, jobs that make progress.

Model, stated so results can be read correctly:

- Time is virtual. Events (job arrival, job completion, a node joining, a revocation notice, a
  node disappearing, a metrics sample, a moment the step's ledgers say something falls due) are
  processed in time order; after each batch of events at one instant the simulator runs the live
  loop's step (:func:`scheduler.step.step`: ledgers, evictions due, torn gangs, then gangs decided
  in turn on one snapshot, a batch of them) until no gang is ready, as the live scheduler does
  after a cluster event. It carries out the step's effects on the simulated cluster: a binding
  binds at once, an eviction succeeds at once.
- A job is a gang of ``max_pods`` members of ``pod_gpus`` GPUs; it makes progress only while at
  least ``min_pods`` members are bound, at a rate proportional to the members bound (linear
  scaling), and finishes when it has done ``duration`` seconds of full-size work.
- Every membership change (start, growth, shrink) costs ``restart_seconds`` of no progress, as an
  elastic launcher's re-rendezvous does. Workers checkpoint every ``checkpoint_interval``
  seconds of run time.
- A checkpoint of a job takes :meth:`Settings.checkpoint_time`: a fixed part plus the job's
  model state (a share per GPU of the job at full size) at the storage's bandwidth, so larger
  jobs take longer (docs/benchmarks.md, "Losing the least on spot", says where the figures come
  from). Jobs are synchronous gangs: a member that leaves without a complete checkpoint rolls
  the whole gang back to its last one, and that work is counted as lost.
- A revocation removes a spot node at the time the spot trace says. With ``checkpoint_on_notice``
  (the node agent) the scheduler stops placing on the node ``notice_seconds`` before that (the
  node is cordoned and tainted ``shoal.dev/revoking``), and the node's workers checkpoint (their
  job makes no progress meanwhile) and leave: no work is lost when the notice is at least the
  checkpoint's time; when it is shorter they leave at once and their gang rolls back. Without
  ``checkpoint_on_notice`` the workers die at removal and their job rolls back to its
  last periodic checkpoint. Either way a gang left below its minimum makes no progress; it is
  *torn* (:mod:`scheduler.torn`), as in the live loop: it comes first in the next decisions, and
  if no room is found for its missing members its survivors keep their GPUs for the torn grace,
  then are asked to leave (the reclaim grace) and evicted, and the whole gang waits to be
  admitted again.
- Reclaim, with the live loop's ledger (:mod:`scheduler.reclaim_ledger`): when a gang's minimum
  does not fit and the cycle names victims (surplus members of other gangs), the room it
  nominated is held for that gang, and the victims leave ``reclaim_grace`` seconds later (their
  eviction succeeds at once). The clock stops, and the step runs, at every moment the ledgers
  say something is due: an eviction, a hold that ends (room given back counts as freed), a torn
  gang's release (its survivors leave as victims do, counted apart). A victim that was asked to
  leave checkpoints first when workers act on notices (``checkpoint_on_notice``) and its
  checkpoint fits in the grace; otherwise its gang rolls back to its last periodic checkpoint,
  and that work is counted as lost to reclaim.
- Shoal's loss features are switched on per run (:data:`FEATURES`); all off is the scheduler
  as it was before them. Goodput is the full-size work done over the GPU-seconds bound.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contracts import names, progress
from scheduler import topology
from scheduler.cache import Cache, Snapshot
from scheduler.cycle import Config, Decision
from scheduler.loss import PATIENCE_ANNOTATION
from scheduler.model import (
    Assignment,
    Gang,
    GangKey,
    Node,
    NodeName,
    PodKey,
    PodRequest,
    Resources,
    Taint,
)
from scheduler.placement.risk import (
    MAX_MEMBER_RISK_ANNOTATION,
    MAX_QUORUM_RISK_ANNOTATION,
    RiskLedger,
)
from scheduler.placement.score import Weights
from scheduler.placement.shapes import ShapeLedger
from scheduler.queue import GangQueue
from scheduler.reclaim_ledger import ReclaimLedger
from scheduler.simulate.inputs import JobSpec, SpotEvent
from scheduler.step import Ask, Ledgers, Opening, Step, StepSettings, step

NAMESPACE = "sim"
_EPS = 1e-6

#: The policies compared. All run through the same search; only the configuration differs.
POLICIES: Mapping[str, Config] = {
    "shoal": Config(),
    # Most-allocated node first (GPUs only), no topology or capacity-type preference.
    "best-fit": Config(
        topology_keys=(),
        weights=Weights(island=0, capacity=0, together=0, tight=1, strand=0, rest=0),
    ),
    # kube-scheduler's default spreading: least-allocated node first.
    "least-allocated": Config(
        topology_keys=(),
        weights=Weights(island=0, capacity=0, together=0, tight=-1, strand=0, rest=0),
    ),
}


#: The Shoal features a run may switch on (:attr:`Settings.features`); each is off unless named.
#:
#: - ``least-loss``: workers report their progress (``shoal.dev/progress``, kept up to date on
#:   the simulated pods at every checkpoint), so reclaim takes the members whose expected loss is
#:   smallest (:mod:`scheduler.loss`) instead of the youngest;
#: - ``patience``: every gang carries ``shoal.dev/reclaim-patience``
#:   (:attr:`Settings.patience_seconds`): its reclaim waits for the victims' next checkpoint
#:   (needs ``least-loss``: a member that reports no progress is asked at once);
#: - ``early-warning``: a spot node gets an early warning :attr:`Settings.warning_seconds` before
#:   its removal (a rebalance recommendation, cordoned as a termination handler does), and the
#:   step moves its surplus members at their next checkpoint (:mod:`scheduler.early_warning`);
#: - ``risk``: risk-aware placement (:mod:`scheduler.placement.risk`): revocation rates per
#:   capacity pool learned from the notices (each noticed node is tainted
#:   ``shoal.dev/revoking``, as its agent does), a quorum on the lowest-risk capacity that holds
#:   it. No operator table: the rates start at 0 and are learned during the run;
#: - ``quorum-bound``: every gang whose checkpoint takes longer than the notice asks for
#:   ``shoal.dev/max-quorum-risk`` (:attr:`Settings.max_quorum_risk`): with ``risk``, its quorum
#:   waits rather than go to capacity that risks more than that of losing a member in an hour;
#: - ``member-bound``: every gang whose checkpoint takes longer than the notice asks for
#:   ``shoal.dev/max-member-risk`` (:attr:`Settings.max_member_risk`): with ``risk``, each of its
#:   surplus members goes to the lowest-risk capacity, and waits rather than take a node that
#:   risks more than that of being revoked in an hour (a revoked surplus member rolls such a
#:   gang back as a quorum member does).
FEATURES: tuple[str, ...] = (
    "least-loss",
    "patience",
    "early-warning",
    "risk",
    "quorum-bound",
    "member-bound",
)


@dataclass(frozen=True, slots=True)
class Settings:
    notice_seconds: float = 120.0
    #: A checkpoint takes ``checkpoint_seconds + GPUs * checkpoint_gb_per_gpu /
    #: storage_gb_per_second`` (:meth:`checkpoint_time`; docs/benchmarks.md, "Losing the least
    #: on spot", says where the figures come from).
    checkpoint_seconds: float = 20.0
    checkpoint_gb_per_gpu: float = 0.0
    storage_gb_per_second: float = 2.5
    restart_seconds: float = 30.0
    checkpoint_interval: float = 1800.0
    checkpoint_on_notice: bool = True
    sample_every: float = 300.0
    #: Seconds between asking a reclaimed member to leave and its departure (the live default).
    reclaim_grace: float = 30.0
    #: Room held for a gang after its victims were chosen, beyond the grace (the live default).
    hold_extra: float = 120.0
    #: How long a torn gang stays stuck before its survivors are released (the live default).
    torn_grace: float = 60.0
    #: Gangs decided in turn on one snapshot, at most (the live default).
    batch_decisions: int = 64
    #: Keep every effect of the step in ``Result.effects`` (for comparing with the live loop).
    record_effects: bool = False
    #: Stop the clock here even if jobs remain (seconds after the first submission).
    horizon: float | None = None
    #: The Shoal features switched on (names from :data:`FEATURES`).
    features: frozenset[str] = frozenset()
    #: With ``patience``: how long a reclaim may wait for its victims' next checkpoint.
    patience_seconds: float = 1800.0
    #: With ``early-warning``: how long before its removal a spot node is warned (0: never).
    warning_seconds: float = 0.0
    #: With ``quorum-bound``: the chance of losing a quorum member within an hour a gang
    #: whose checkpoint outlasts the notice accepts.
    max_quorum_risk: float = 0.05
    #: With ``member-bound``: the chance of losing a surplus member within an hour a gang
    #: whose checkpoint outlasts the notice accepts.
    max_member_risk: float = 0.05
    #: Count the pod shapes and gang sizes that arrive in what a placement costs, as the live
    #: loop does by default (``--arrived-shapes``), for a policy whose weights count what a
    #: placement costs the likely pods (Shoal's).
    arrived_shapes: bool = True

    def checkpoint_time(self, spec: JobSpec) -> float:
        """Seconds one checkpoint of ``spec`` takes: a fixed part plus its model state (a
        share per GPU of the job at full size) written at the storage's bandwidth."""
        if self.storage_gb_per_second <= 0:
            return self.checkpoint_seconds
        state = spec.gpus * self.checkpoint_gb_per_gpu
        return self.checkpoint_seconds + state / self.storage_gb_per_second

    def label(self) -> str:
        """The features on, as a table shows them."""
        on = [f for f in FEATURES if f in self.features]
        return "+".join(on) if on else "none"


@dataclass(slots=True)
class _Job:
    spec: JobSpec
    pods: dict[PodKey, PodRequest]
    work: float = 0.0
    saved: float = 0.0
    last: float = 0.0
    paused_until: float = 0.0
    origin: float = 0.0
    first_admit: float | None = None
    finished: float | None = None
    version: int = 0
    down_since: float | None = None
    down_revocations: list[int] = field(default_factory=list)
    rack_measured: bool = False
    cached: Gang | None = None
    bound_count: int = 0
    #: When its last complete checkpoint was taken (``None``: none yet), and the one its
    #: members' progress reports last said.
    saved_at: float | None = None
    reported: tuple[float | None, float] | None = None

    @property
    def key(self) -> GangKey:
        return GangKey(f"{NAMESPACE}/{self.spec.id}")

    @property
    def bound(self) -> int:
        return self.bound_count

    @property
    def running(self) -> bool:
        return self.bound >= self.spec.min_pods

    def gang(self) -> Gang:
        """The gang as the scheduler sees it; rebuilt only after its members changed."""
        if self.cached is None:
            self.cached = self._gang()
        return self.cached

    def changed(self) -> None:
        self.cached = None

    def _gang(self) -> Gang:
        return Gang(
            key=self.key,
            namespace=NAMESPACE,
            name=self.spec.id,
            min_member=self.spec.min_pods,
            max_member=self.spec.max_pods,
            members=tuple(self.pods.values()),
            priority=self.spec.priority,
            created=self.spec.submit,
        )


@dataclass(slots=True)
class Revocation:
    node: str
    time: float
    notice: float
    jobs: int = 0
    pods: int = 0
    lost_gpu_seconds: float = 0.0
    downtime_seconds: float = 0.0
    #: Jobs it took below their minimum (a member of their quorum was on the node).
    quorum_jobs: int = 0
    #: Of ``pods``, those above their gang's minimum (surplus) when the node went.
    surplus_pods: int = 0


@dataclass(slots=True)
class Result:
    policy: str
    settings: Settings
    #: (time, GPU allocation, fragmentation, pods waiting) every ``sample_every`` seconds, each
    #: taken after the scheduler has acted on that instant's events (for plots).
    samples: list[tuple[float, float, float, int]] = field(default_factory=list)
    #: Time integrals of the same quantities, exact (every change is an event): GPU-seconds in
    #: use and in existence, overall and while some gang waits for its minimum; seconds
    #: weighted by fragmentation; seconds during which some gang waits.
    used_gpu_seconds: float = 0.0
    capacity_gpu_seconds: float = 0.0
    used_gpu_seconds_waiting: float = 0.0
    capacity_gpu_seconds_waiting: float = 0.0
    fragmentation_seconds: float = 0.0
    fragmentation_seconds_waiting: float = 0.0
    seconds_waiting: float = 0.0
    jobs: list[dict[str, Any]] = field(default_factory=list)
    revocations: list[Revocation] = field(default_factory=list)
    gangs_admitted_multi: int = 0
    gangs_one_rack: int = 0
    gangs_one_rack_possible: int = 0
    gangs_one_rack_when_possible: int = 0
    multi_gpu_pods: int = 0
    multi_gpu_pods_in_island: int = 0
    multi_gpu_pods_island_possible: int = 0
    cycles: int = 0
    decision_seconds: list[float] = field(default_factory=list)
    end_time: float = 0.0
    wall_seconds: float = 0.0
    spot_nodes_unmapped: int = 0
    reclaimed_pods: int = 0
    reclaim_lost_gpu_seconds: float = 0.0
    #: Gangs torn below their minimum and told so, and those released (survivors asked to
    #: leave), with the members evicted for it.
    torn_told: int = 0
    torn_released: int = 0
    torn_released_pods: int = 0
    torn_released_lost_gpu_seconds: float = 0.0
    #: Surplus members moved off a node with an early warning, and the work that cost.
    moved_pods: int = 0
    moved_lost_gpu_seconds: float = 0.0
    #: Full-size work done by the end (GPU-seconds a job at full size would have spent on it).
    useful_gpu_seconds: float = 0.0
    #: Members revoked, by their job's GPUs at full size: (quorum members, surplus members).
    revoked_by_job_gpus: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: Bindings to spot nodes: members of a quorum (the first ``min`` of a gang) or surplus.
    spot_binds_quorum: int = 0
    spot_binds_surplus: int = 0
    binds_quorum: int = 0
    binds_surplus: int = 0
    #: With ``record_effects``: (time, effect, pod or gang, detail) as the loop carried them out.
    effects: list[tuple[float, str, str, str]] = field(default_factory=list)

    def lost_gpu_seconds(self) -> float:
        """Work rolled back, for every cause: revocations, reclaims, torn gangs released,
        members moved off warned nodes."""
        return (
            sum(r.lost_gpu_seconds for r in self.revocations)
            + self.reclaim_lost_gpu_seconds
            + self.torn_released_lost_gpu_seconds
            + self.moved_lost_gpu_seconds
        )

    def summary(self) -> dict[str, Any]:
        done = [j for j in self.jobs if j["finished"] is not None]
        waits = sorted(j["wait"] for j in self.jobs if j["wait"] is not None)
        jcts = sorted(j["finished"] - j["submit"] for j in done)
        decisions = sorted(self.decision_seconds)
        return {
            "policy": self.policy,
            "checkpoint_on_notice": self.settings.checkpoint_on_notice,
            "jobs": len(self.jobs),
            "jobs_finished": len(done),
            "simulated_seconds": round(self.end_time, 1),
            "gpu_allocation_mean": _ratio(self.used_gpu_seconds, self.capacity_gpu_seconds),
            "gpu_allocation_while_jobs_wait": _ratio(
                self.used_gpu_seconds_waiting, self.capacity_gpu_seconds_waiting
            ),
            "fragmentation_mean": _ratio(self.fragmentation_seconds, self.end_time),
            "fragmentation_while_jobs_wait": _ratio(
                self.fragmentation_seconds_waiting, self.seconds_waiting
            ),
            "share_of_time_jobs_wait": _ratio(self.seconds_waiting, self.end_time),
            "job_wait_mean_s": _mean(waits),
            "job_wait_p50_s": _pct(waits, 50),
            "job_wait_p99_s": _pct(waits, 99),
            "jct_mean_s": _mean(jcts),
            "jct_p50_s": _pct(jcts, 50),
            "jct_p99_s": _pct(jcts, 99),
            "makespan_s": round(max((j["finished"] for j in done), default=0.0), 1),
            "gangs_in_one_rack": _share(self.gangs_one_rack, self.gangs_admitted_multi),
            "gangs_in_one_rack_when_possible": _share(
                self.gangs_one_rack_when_possible, self.gangs_one_rack_possible
            ),
            "multi_gpu_pods_in_one_island": _share(
                self.multi_gpu_pods_in_island, self.multi_gpu_pods
            ),
            "multi_gpu_pods_in_one_island_when_possible": _share(
                self.multi_gpu_pods_in_island, self.multi_gpu_pods_island_possible
            ),
            "revocations": len(self.revocations),
            "revocations_affecting_jobs": sum(1 for r in self.revocations if r.jobs),
            "lost_gpu_hours": round(sum(r.lost_gpu_seconds for r in self.revocations) / 3600, 2),
            "lost_gpu_seconds_per_revocation": _mean(
                [r.lost_gpu_seconds for r in self.revocations if r.jobs]
            ),
            "downtime_seconds_per_revocation": _mean(
                [r.downtime_seconds for r in self.revocations if r.jobs]
            ),
            "reclaimed_pods": self.reclaimed_pods,
            "reclaim_lost_gpu_hours": round(self.reclaim_lost_gpu_seconds / 3600, 2),
            "features": self.settings.label(),
            "goodput": _ratio(self.useful_gpu_seconds, self.used_gpu_seconds),
            "lost_gpu_hours_total": round(self.lost_gpu_seconds() / 3600, 2),
            "quorum_revocations": sum(1 for r in self.revocations if r.quorum_jobs),
            "revoked_pods": sum(r.pods for r in self.revocations),
            "revoked_surplus_pods": sum(r.surplus_pods for r in self.revocations),
            "moved_pods": self.moved_pods,
            "moved_lost_gpu_hours": round(self.moved_lost_gpu_seconds / 3600, 2),
            "torn_released_lost_gpu_hours": round(self.torn_released_lost_gpu_seconds / 3600, 2),
            "binds_quorum": self.binds_quorum,
            "binds_surplus": self.binds_surplus,
            "spot_binds_quorum": self.spot_binds_quorum,
            "spot_binds_surplus": self.spot_binds_surplus,
            "revoked_quorum_and_surplus_members_by_job_gpus": {
                str(gpus): list(pair) for gpus, pair in sorted(self.revoked_by_job_gpus.items())
            },
            "torn_gangs_told": self.torn_told,
            "torn_gangs_released": self.torn_released,
            "torn_released_pods": self.torn_released_pods,
            "scheduling_cycles": self.cycles,
            "decision_ms_p50": _pct([d * 1000 for d in decisions], 50),
            "decision_ms_p99": _pct([d * 1000 for d in decisions], 99),
            "spot_joins_with_no_free_spot_node": self.spot_nodes_unmapped,
            "wall_seconds": round(self.wall_seconds, 2),
        }


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def _pct(values: Sequence[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))
    return round(ordered[index], 3)


def _ratio(part: float, whole: float) -> float | None:
    return round(part / whole, 4) if whole > 0 else None


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _pod(spec: JobSpec, index: int, annotations: Mapping[str, str]) -> PodRequest:
    name = f"{spec.id}-{index}"
    return PodRequest(
        annotations=annotations,
        key=PodKey(f"{NAMESPACE}/{name}"),
        namespace=NAMESPACE,
        name=name,
        uid=name,
        requests=Resources(
            cpu_milli=1000 * spec.pod_gpus, memory=2**30 * spec.pod_gpus, gpu=spec.pod_gpus, pods=1
        ),
        scheduler_name=names.SCHEDULER_NAME,
        priority=spec.priority,
        created=spec.submit,
    )


class Simulation:
    """One run of one policy over one input. ``run()`` returns the :class:`Result`."""

    def __init__(
        self,
        nodes: Sequence[Node],
        jobs: Sequence[JobSpec],
        spot: Sequence[SpotEvent],
        policy: str,
        settings: Settings = Settings(),
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose from {sorted(POLICIES)}")
        self.config = POLICIES[policy]
        if "risk" in settings.features:
            self.config = dataclasses.replace(self.config, risk=RiskLedger())
        if settings.arrived_shapes and self.config.weights.fragment:
            self.config = dataclasses.replace(self.config, shapes=ShapeLedger())
        self.settings = settings
        self.result = Result(policy=policy, settings=settings)
        self.cache = Cache(assume_ttl=math.inf, topology_keys=self.config.topology_keys)
        #: The live loop's step state: backoffs, victims and held room, torn gangs.
        self.ledgers = Ledgers(
            StepSettings(
                config=self.config,
                batch_decisions=settings.batch_decisions,
                reclaim_grace=settings.reclaim_grace,
                hold_extra=settings.hold_extra,
                torn_grace=settings.torn_grace,
                # A node is cordoned at its notice, which tells its pods at once; only the
                # early warnings of the ``early-warning`` feature come before.
                early_warnings="early-warning" in settings.features,
            )
        )
        unknown = settings.features - set(FEATURES)
        if unknown:
            raise ValueError(f"unknown features {sorted(unknown)}; choose from {FEATURES}")
        self.progress = "least-loss" in settings.features
        self.nodes = {n.name: n for n in nodes}
        self.live: set[NodeName] = set()
        self.jobs: dict[str, _Job] = {}
        for spec in jobs:
            notes = self._annotations(spec)
            pods = (_pod(spec, i, notes) for i in range(spec.max_pods))
            self.jobs[spec.id] = _Job(spec, {p.key: p for p in pods})
        self.active: dict[str, _Job] = {}
        self.owner = {key: job for job in self.jobs.values() for key in job.pods}
        #: Members of torn gangs asked to leave (their eviction is not a reclaim).
        self._released: set[PodKey] = set()
        #: Surplus members asked to leave a node with an early warning (not a reclaim either).
        self._moved: set[PodKey] = set()
        #: The latest revocation record of each node.
        self._last_revocation: dict[NodeName, int] = {}
        #: Times at which a "tick" event is queued (one per instant is enough).
        self._ticks: set[float] = set()
        self._events: list[tuple[float, int, str, Any]] = []
        self._current: tuple[float, int, int, float, int] | None = None
        self._seq = itertools.count()
        self._plan(spot)

    def _annotations(self, spec: JobSpec) -> dict[str, str]:
        """What the features put on a job's pods from the start."""
        settings = self.settings
        notes = {}
        if "patience" in settings.features:
            notes[PATIENCE_ANNOTATION] = f"{settings.patience_seconds:g}"
        short = settings.checkpoint_time(spec) > settings.notice_seconds
        if "quorum-bound" in settings.features and short:
            notes[MAX_QUORUM_RISK_ANNOTATION] = f"{settings.max_quorum_risk:g}"
        if "member-bound" in settings.features and short:
            notes[MAX_MEMBER_RISK_ANNOTATION] = f"{settings.max_member_risk:g}"
        return notes

    @property
    def queue(self) -> GangQueue:
        return self.ledgers.queue

    @property
    def reclaims(self) -> ReclaimLedger:
        return self.ledgers.reclaims

    # -- set-up ------------------------------------------------------------------------------
    def _push(self, when: float, kind: str, data: Any) -> None:
        heapq.heappush(self._events, (when, next(self._seq), kind, data))

    def _plan(self, spot: Sequence[SpotEvent]) -> None:
        """Queue the opening events: every node joins at 0 (spot nodes as the trace says when
        there is one), each job arrives at its submit time, and the first sample."""
        if not spot:
            for name in self.nodes:
                self._push(0.0, "add", name)
        else:
            for node in self.nodes.values():
                if not node.spot:
                    self._push(0.0, "add", node.name)
            self._plan_spot(spot)
        for job in self.jobs.values():
            self._push(job.spec.submit, "arrive", job.spec.id)
        self._push(0.0, "sample", None)

    def _plan_spot(self, spot: Sequence[SpotEvent]) -> None:
        """Map the trace's instances onto the spot nodes.

        The trace's instances come and go; each one that joins takes a spot node that is free
        at that moment (a slot), and gives it back when it is revoked (after its notice).
        Instances that join while every slot is taken are counted and left out.
        """
        free = [n.name for n in self.nodes.values() if n.spot]
        holder: dict[str, tuple[NodeName, float]] = {}
        unmapped: set[str] = set()
        for event in spot:
            if event.kind == "add":
                if event.node in holder:
                    continue
                if not free:
                    unmapped.add(event.node)
                    continue
                target = free.pop(0)
                holder[event.node] = (target, event.time)
                self._push(event.time, "add", target)
            elif event.node in holder:
                target, since = holder.pop(event.node)
                notice_at = max(since, event.time - self.settings.notice_seconds)
                warn_at = max(since, event.time - self.settings.warning_seconds)
                if self.settings.warning_seconds > 0 and warn_at < notice_at:
                    self._push(warn_at, "warn", target)
                self._push(notice_at, "notice", (target, event.time))
                self._push(event.time, "remove", target)
                free.append(target)
        self.result.spot_nodes_unmapped = len(unmapped)

    # -- the clock ---------------------------------------------------------------------------
    def run(self) -> Result:
        started = time.perf_counter()
        now = 0.0
        horizon = self.settings.horizon
        while self._events:
            at = self._events[0][0]
            if horizon is not None and at > horizon:
                self._integrate(horizon)
                now = horizon
                break
            self._integrate(at)
            now = at
            effects: set[str] = set()
            while self._events and self._events[0][0] == now:
                _, _, kind, data = heapq.heappop(self._events)
                effects.add(self._handle(kind, data, now))
            if effects & {"freed", "arrived", "tick"}:
                # Like the live scheduler: gangs backing off are retried when room may have
                # been freed; a new gang is tried at once either way; the step runs when its
                # ledgers said something falls due.
                self._schedule(now, wake="freed" in effects)
            self._wake_for_step(now)
            self._observe(now, sample="sample" in effects)
            if not self.active and all(j.finished is not None for j in self.jobs.values()):
                break
        for job in self.jobs.values():
            self._advance(job, now)
        self._close(now)
        self.result.end_time = now
        self.result.wall_seconds = time.perf_counter() - started
        return self.result

    def _handle(self, kind: str, data: Any, now: float) -> str:
        """Apply one event; says whether it "freed" room, "arrived" a gang, asks for a
        "sample", for the step ("tick"), or none of these ("")."""
        match kind:
            case "arrive":
                effect = self._on_arrive(data, now)
            case "finish":
                effect = self._on_finish(data, now)
            case "add":
                effect = self._on_add(data)
            case "notice":
                effect = self._on_notice(data, now)
            case "warn":
                effect = self._on_warn(data)
            case "remove":
                effect = self._on_remove(data, now)
            case "tick":
                effect = self._on_tick(now)
            case "sample":
                effect = self._on_sample(now)
            case _:
                raise AssertionError(kind)
        return effect

    def _on_arrive(self, job_id: str, now: float) -> str:
        """A job is submitted: its pods enter the cache and its gang becomes active."""
        job = self.jobs[job_id]
        job.last = now
        self.active[job_id] = job
        for pod in job.pods.values():
            self.cache.set_pod(pod)
        return "arrived"

    def _on_finish(self, due: tuple[str, int], now: float) -> str:
        """A job's finish falls due: frees its room if it has done its work, else (it ran
        slower than planned) its finish moves later. A stale finish event is ignored."""
        job_id, version = due
        running = self.active.get(job_id)
        if running is None or running.version != version:
            return ""
        self._advance(running, now)
        if running.work >= running.spec.duration - _EPS:
            self._finish(running, now)
            return "freed"
        self._reschedule_finish(running, now)
        return ""

    def _on_add(self, node: NodeName) -> str:
        """A node joins: room appears."""
        self.live.add(node)
        self.cache.set_node(self.nodes[node])
        return "freed"

    def _on_notice(self, notice: tuple[NodeName, float], now: float) -> str:
        """A spot node will be removed at the given time: its pods checkpoint and leave now,
        when the settings say workers act on notices."""
        node, removal = notice
        if node in self.live and self.settings.checkpoint_on_notice:
            self._revoke(node, now, notice=removal - now)
        return "freed"

    def _on_warn(self, node: NodeName) -> str:
        """An early warning (a rebalance recommendation): the node is cordoned, as a
        termination handler does, and the step decides what to move."""
        if node in self.live:
            self.cache.set_node(dataclasses.replace(self.nodes[node], unschedulable=True))
        return "tick"

    def _on_remove(self, node: NodeName, now: float) -> str:
        """A node is gone, with whatever still ran on it."""
        if node in self.live:
            self._revoke(node, now, notice=0.0, remove=True)
        return "freed"

    def _on_tick(self, now: float) -> str:
        """The step's ledgers have something due: a hold that ends, a victim to evict, a torn
        gang to release."""
        self._ticks.discard(now)
        return "tick"

    def _on_sample(self, now: float) -> str:
        """Take a sample; the next one is queued while anything is running or still to come."""
        if self.active or any(k == "arrive" for _, _, k, _ in self._events):
            self._push(now + self.settings.sample_every, "sample", None)
        return "sample"

    # -- scheduling --------------------------------------------------------------------------
    def _schedule(self, now: float, *, wake: bool) -> None:
        """Run the live loop's step until no gang is ready: each step on a fresh snapshot,
        its effects carried out on the simulated cluster at once."""
        if wake:
            self.ledgers.freed()
        while True:
            if self.progress:
                self._report_progress(now)
            gangs = [job.gang() for job in self.active.values()]
            snapshot = self.cache.snapshot()
            this = step(self.ledgers, gangs, snapshot, now)
            freed = self._open(this.opening, now)
            decided = self._carry_out(this, snapshot, now)
            if freed:
                self.ledgers.freed()
            elif not decided:
                return

    def _open(self, opening: Opening, now: float) -> bool:
        """Evict the victims due (they leave at once), tell and release torn gangs; says
        whether room was freed (a hold given back counts)."""
        freed = bool(opening.expired)
        for pod in opening.evict:
            self._effect(now, "evict", pod.name)
            freed |= self._leave(pod.key, now)
            self.ledgers.evicted(pod.key)
        for told in opening.told:
            self.result.torn_told += told.first
            self._effect(now, "torn", told.gang.name, f"{told.release_at:g}")
        for release in opening.released:
            if not release.asked:
                continue
            self.result.torn_released += 1
            self._effect(now, "released", release.torn.gang.name, f"{release.leave_by:g}")
            for pod in release.asked:
                self._released.add(pod.key)
                self._effect(now, "ask", pod.name, f"{release.leave_by:g}")
        for shrink in opening.shrunk:
            for pod in shrink.asked:
                self._effect(now, "ask", pod.name, f"{shrink.leave_by:g}")
        self._asked(opening.asks, now)
        return freed

    def _asked(self, asks: Sequence[Ask], now: float) -> None:
        """Victims that waited for their checkpoint asked now, and surplus members of warned
        nodes (asked for their own gang: moved, not reclaimed)."""
        for ask in asks:
            for pod in ask.asked:
                if self.owner[pod.key].key == ask.gang.key:
                    self._moved.add(pod.key)
                self._effect(now, "ask", pod.name, f"{ask.leave_by:g}")
            self._wake_at_checkpoints(ask.waiting, now)

    def _carry_out(self, this: Step, snapshot: Snapshot, now: float) -> bool:
        """Carry out the step's decisions in turn; says whether there was any. Each one's
        placement is measured on the view it was decided on: the snapshot with the batch's
        earlier bindings, less the room held for other gangs."""
        placed: list[Assignment] = []
        decided = False
        started = time.perf_counter()
        for outcome in this.outcomes:
            decided = True
            self.result.cycles += 1
            self.result.decision_seconds.append(time.perf_counter() - started)
            decision = outcome.decision
            if outcome.told is not None:
                self.result.torn_told += outcome.told.first
                gang_name = decision.gang.name
                self._effect(now, "torn", gang_name, f"{outcome.told.release_at:g}")
            for pod in outcome.asked:
                self._effect(now, "ask", pod.name, f"{outcome.leave_by:g}")
            self._wake_at_checkpoints(outcome.waiting, now)
            if decision.progressed:
                held = this.reserved.items()
                view = snapshot.with_assignments(placed).with_reserved(
                    r for key, room in held if key != decision.gang.key for r in room
                )
                placed.extend(decision.bindings)
                for pod, node in outcome.binds:
                    self._effect(now, "bind", pod.name, node)
                self._apply(decision, view, now)
            started = time.perf_counter()
        return decided

    def _effect(self, now: float, kind: str, name: str, detail: str = "") -> None:
        if self.settings.record_effects:
            self.result.effects.append((now, kind, name, detail))

    def _wake_at_checkpoints(self, pods: Sequence[PodRequest], now: float) -> None:
        """Run the step again at the next checkpoint of each job whose members wait for it
        (their progress report changes then)."""
        interval = self.settings.checkpoint_interval
        if interval <= 0:
            return
        for pod in pods:
            job = self.owner[pod.key]
            if job.finished is None and job.running:
                due = job.origin + (math.floor((now - job.origin) / interval) + 1) * interval
                if due not in self._ticks:
                    self._ticks.add(due)
                    self._push(due, "tick", None)

    def _report_progress(self, now: float) -> None:
        """Keep each bound job's ``shoal.dev/progress`` report on its pods, as its workers and
        node agents would: rewritten when the job completes a checkpoint or restarts."""
        for job in self.active.values():
            if not job.bound:
                continue
            self._advance(job, now)
            mark = (job.saved_at, job.origin)
            if mark == job.reported:
                continue
            job.reported = mark
            at = job.origin if job.saved_at is None else max(job.saved_at, job.origin)
            step = int(job.saved)
            text = progress.encode(
                progress.Progress(
                    step=step,
                    step_seconds=1.0,
                    checkpoint_step=step,
                    checkpoint_at=job.saved_at,
                    checkpoint_seconds=self.settings.checkpoint_time(job.spec),
                    reported_at=at,
                )
            )
            for key, pod in job.pods.items():
                notes = {**pod.annotations, names.PROGRESS_ANNOTATION: text}
                job.pods[key] = dataclasses.replace(pod, annotations=notes)
                self.cache.set_pod(job.pods[key])
            job.changed()

    def _wake_for_step(self, now: float) -> None:
        """Stop the clock when the step's ledgers next have something due (an eviction, a
        hold that ends, a torn gang's release)."""
        due = self.ledgers.next_due()
        if due is not None and due >= now and due not in self._ticks:
            self._ticks.add(due)
            self._push(due, "tick", None)

    def _apply(self, decision: Decision, snapshot: Snapshot, now: float) -> None:
        job = self.active[decision.gang.name]
        self._advance(job, now)
        was_running = job.running
        self._measure_placement(decision, snapshot)
        for index, assignment in enumerate(decision.bindings):
            in_quorum = index < decision.min_count
            spot = self.nodes[assignment.node].spot
            self.result.binds_quorum += in_quorum
            self.result.binds_surplus += not in_quorum
            self.result.spot_binds_quorum += in_quorum and spot
            self.result.spot_binds_surplus += spot and not in_quorum
            pod = dataclasses.replace(job.pods[assignment.pod], node=assignment.node)
            job.pods[pod.key] = pod
            job.bound_count += 1
            self.cache.set_pod(pod)
        job.changed()
        if job.spec.min_pods >= 2 and decision.min_count and not job.rack_measured:
            job.rack_measured = True
            quorum = [a.node for a in decision.bindings[: decision.min_count]]
            quorum += [p.node for p in decision.gang.bound if p.node is not None]
            self._measure_rack(job, quorum, snapshot)
        if job.running and not was_running:
            job.origin = now
            if job.first_admit is None:
                job.first_admit = now
            if job.down_since is not None:
                down = now + self.settings.restart_seconds - job.down_since
                for index in job.down_revocations:
                    self.result.revocations[index].downtime_seconds += down
                job.down_since = None
                job.down_revocations.clear()
        job.paused_until = max(job.paused_until, now + self.settings.restart_seconds)
        self._reschedule_finish(job, now)

    # -- progress ------------------------------------------------------------------------------
    def _advance(self, job: _Job, now: float) -> None:
        if job.finished is not None:
            return
        start = max(job.last, job.paused_until)
        if job.running and now > start:
            rate = job.bound / job.spec.max_pods
            interval = self.settings.checkpoint_interval
            if interval > 0:
                last_checkpoint = job.origin + math.floor((now - job.origin) / interval) * interval
                if last_checkpoint > start:
                    job.saved = job.work + rate * (last_checkpoint - start)
                    job.saved_at = last_checkpoint
            job.work = min(job.spec.duration, job.work + rate * (now - start))
        job.last = now

    def _reschedule_finish(self, job: _Job, now: float) -> None:
        job.version += 1
        if not job.running:
            return
        rate = job.bound / job.spec.max_pods
        start = max(now, job.paused_until)
        self._push(
            start + (job.spec.duration - job.work) / rate, "finish", (job.spec.id, job.version)
        )

    def _finish(self, job: _Job, now: float) -> None:
        job.finished = now
        for key in job.pods:
            self.cache.remove_pod(key)
        del self.active[job.spec.id]
        self.queue.prune(j.key for j in self.active.values())

    def _revoke(self, node: NodeName, now: float, *, notice: float, remove: bool = False) -> None:
        """The node is going: workers leave (notice) or die (removal)."""
        record_index = self._revocation_record(node, now, notice)
        record = self.result.revocations[record_index]
        if remove:
            self.live.discard(node)
            self.cache.remove_node(node)
        else:
            # Cordoned and tainted shoal.dev/revoking, as its node agent does on a notice.
            noticed = dataclasses.replace(
                self.nodes[node],
                unschedulable=True,
                taints=(*self.nodes[node].taints, Taint(names.REVOKING_TAINT)),
            )
            self.cache.set_node(noticed)
        for job in list(self.active.values()):
            leaving = [k for k, p in job.pods.items() if p.node == node]
            if not leaving:
                continue
            record.jobs += 1
            record.pods += len(leaving)
            surplus = min(len(leaving), max(0, job.bound - job.spec.min_pods))
            record.surplus_pods += surplus
            quorum_before, surplus_before = self.result.revoked_by_job_gpus.get(
                job.spec.gpus, (0, 0)
            )
            self.result.revoked_by_job_gpus[job.spec.gpus] = (
                quorum_before + len(leaving) - surplus,
                surplus_before + surplus,
            )
            self._advance(job, now)
            pause = self.settings.restart_seconds
            checkpoint = self.settings.checkpoint_time(job.spec)
            if not remove and notice >= checkpoint:
                # The notice leaves time to finish a checkpoint: nothing is lost.
                job.saved, job.saved_at = job.work, now
                pause += checkpoint
            else:
                # The gang (synchronous) rolls back to its last complete checkpoint.
                record.lost_gpu_seconds += (job.work - job.saved) * job.spec.gpus
                job.work = job.saved
            was_running = job.running
            for key in leaving:
                self._unbind(job, key)
            if not job.running:
                # Stopped (its survivors, if any, wait torn for the rest): down until it runs
                # again.
                record.quorum_jobs += was_running
                if was_running or job.down_since is None:
                    job.down_since = now
                job.down_revocations.append(record_index)
            else:
                record.downtime_seconds += pause
            job.paused_until = now + pause
            self._reschedule_finish(job, now)

    def _leave(self, key: PodKey, now: float) -> bool:
        """A reclaimed member leaves; says whether it freed room (it was still bound)."""
        job = self.owner[key]
        if job.finished is not None or job.pods[key].node is None:
            return False
        self._advance(job, now)
        pause = self.settings.restart_seconds
        checkpoint = self.settings.checkpoint_time(job.spec)
        lost = 0.0
        if self.settings.checkpoint_on_notice and checkpoint <= self.settings.reclaim_grace:
            # Asked to leave, it checkpoints within its grace: nothing is lost.
            job.saved, job.saved_at = job.work, now
            pause += checkpoint
        else:
            # It leaves before a checkpoint could finish: the gang rolls back to its last one.
            lost = (job.work - job.saved) * job.spec.gpus
            job.work = job.saved
        if key in self._released:
            self._released.discard(key)
            self.result.torn_released_pods += 1
            self.result.torn_released_lost_gpu_seconds += lost
        elif key in self._moved:
            self._moved.discard(key)
            self.result.moved_pods += 1
            self.result.moved_lost_gpu_seconds += lost
        else:
            self.result.reclaimed_pods += 1
            self.result.reclaim_lost_gpu_seconds += lost
        self._unbind(job, key)
        job.paused_until = now + pause
        self._reschedule_finish(job, now)
        return True

    def _revocation_record(self, node: NodeName, now: float, notice: float) -> int:
        last = self._last_revocation.get(node)
        if last is not None:
            r = self.result.revocations[last]
            if now - r.time <= self.settings.notice_seconds + _EPS:
                return last  # the removal of a node already noticed
        self.result.revocations.append(Revocation(node=node, time=now, notice=notice))
        index = self._last_revocation[node] = len(self.result.revocations) - 1
        return index

    def _unbind(self, job: _Job, key: PodKey) -> None:
        pod = dataclasses.replace(job.pods[key], node=None)
        job.pods[key] = pod
        job.bound_count -= 1
        job.changed()
        self.cache.set_pod(pod)

    def _close(self, now: float) -> None:
        for job in self.jobs.values():
            self.result.useful_gpu_seconds += job.work * job.spec.gpus
            if job.down_since is not None:
                for index in job.down_revocations:
                    self.result.revocations[index].downtime_seconds += now - job.down_since
            self.result.jobs.append(
                {
                    "id": job.spec.id,
                    "submit": job.spec.submit,
                    "gpus": job.spec.gpus,
                    "min_pods": job.spec.min_pods,
                    "max_pods": job.spec.max_pods,
                    "wait": None if job.first_admit is None else job.first_admit - job.spec.submit,
                    "finished": job.finished,
                }
            )

    # -- measurements --------------------------------------------------------------------------
    def _observe(self, now: float, *, sample: bool) -> None:
        """The state after this instant's events, held until the next one (see _integrate).

        Allocation: GPUs bound / GPUs on live nodes (nodes under notice included until they go).
        Fragmentation, while some gang waits for its minimum: the share of free GPUs (on
        schedulable nodes) that sit on nodes with fewer free GPUs than the smallest waiting
        member asks for, i.e. that no waiting job could use; 0 when nothing waits.
        """
        snapshot = self.cache.snapshot()
        live = [s for name, s in snapshot.nodes.items() if name in self.live]
        capacity = sum(s.node.allocatable.gpu for s in live)
        used = sum(s.requested.gpu for s in live)
        waiting = [
            p.requests.gpu
            for job in self.active.values()
            if not job.running
            for p in job.pods.values()
            if p.node is None
        ]
        smallest = min(waiting, default=0)
        free_total = 0
        stranded = 0
        for s in live:
            if s.node.unschedulable:
                continue
            free = max(0, s.free.gpu)
            free_total += free
            if smallest and free < smallest:
                stranded += free
        frag = stranded / free_total if free_total and smallest else 0.0
        self._current = (now, used, capacity, frag, len(waiting))
        if sample:
            alloc = used / capacity if capacity else 0.0
            self.result.samples.append((now, alloc, frag, len(waiting)))

    def _integrate(self, until: float) -> None:
        """Add the state held since the last instant, up to ``until``, to the time integrals."""
        if self._current is None:
            return
        since, used, capacity, frag, waiting = self._current
        dt = until - since
        if dt <= 0:
            return
        r = self.result
        r.used_gpu_seconds += used * dt
        r.capacity_gpu_seconds += capacity * dt
        r.fragmentation_seconds += frag * dt
        if waiting:
            r.used_gpu_seconds_waiting += used * dt
            r.capacity_gpu_seconds_waiting += capacity * dt
            r.fragmentation_seconds_waiting += frag * dt
            r.seconds_waiting += dt
        self._current = (until, used, capacity, frag, waiting)

    def _measure_placement(self, decision: Decision, snapshot: Snapshot) -> None:
        view = snapshot
        for assignment in decision.bindings:
            gpus = view.pods[assignment.pod].requests.gpu
            state = view.nodes[assignment.node]
            if gpus > 1 and state.islands is not None:
                self.result.multi_gpu_pods += 1
                if topology.best_island(state.islands, gpus) is not None:
                    self.result.multi_gpu_pods_in_island += 1
                if any(
                    s.islands is not None
                    and not s.node.unschedulable
                    and topology.best_island(s.islands, gpus) is not None
                    for s in view.nodes.values()
                ):
                    self.result.multi_gpu_pods_island_possible += 1
            view = view.with_assignments([assignment])

    def _measure_rack(self, job: _Job, quorum: list[NodeName], snapshot: Snapshot) -> None:
        """When a gang's quorum (two or more members) is placed: is it in one rack, and could it
        have been (some rack had room for the whole quorum on the snapshot the decision used)?"""
        racks = {self.nodes[node].labels.get(names.RACK_LABEL) for node in quorum}
        self.result.gangs_admitted_multi += 1
        one_rack = len(racks) == 1
        if one_rack:
            self.result.gangs_one_rack += 1
        need = job.spec.min_pods * job.spec.pod_gpus
        free_by_rack: dict[str | None, int] = {}
        for name, state in snapshot.nodes.items():
            if name in self.live and not state.node.unschedulable:
                rack = state.node.labels.get(names.RACK_LABEL)
                slots = max(0, state.free.gpu) // job.spec.pod_gpus * job.spec.pod_gpus
                free_by_rack[rack] = free_by_rack.get(rack, 0) + slots
        if any(v >= need for v in free_by_rack.values()):
            self.result.gangs_one_rack_possible += 1
            self.result.gangs_one_rack_when_possible += one_rack
