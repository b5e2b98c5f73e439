"""Two teams share a cohort under the real Kueue (v0.17.0; ``tests/integration/kueue.py``):
Kueue lends one team's idle quota to the other and takes it back, Shoal places every gang it
admits, whole.

Two ClusterQueues in one cohort cover one ResourceFlavor, the test's three 8-GPU nodes (24 GPUs,
the cohort's whole quota): the lender's (16 GPUs nominal, ``reclaimWithinCohort: Any``) and the
borrower's (8 GPUs nominal, at most 8 more borrowed). Every job is a ``batch/v1`` Job of two
4-GPU workers, one gang for Shoal (its label, minimum 2).

1. The lender is idle. The borrower submits three jobs: two are admitted, the second on quota
   borrowed from the lender (the borrower's ClusterQueue says 8 GPUs borrowed), and both are
   bound whole; the third waits at the borrowing limit (Kueue says why).
2. The lender submits a job, admitted on its own unused quota, then another, which needs the
   quota it lent: Kueue preempts a borrower's job (its Workload ``Preempted``, reason
   ``InCohortReclamation``, and a ``Preempted`` Event), which Kueue suspends and whose pods its
   Job controller deletes; the lender's job is admitted in the room and bound whole.
3. The lender deactivates its first job: its quota is idle again, the borrower borrows it for
   one of its waiting jobs (the preempted one, requeued, or the third), bound whole.

Checked on every version of the pods, Workloads and ClusterQueues the API server's watches gave:

- quota: at every moment, each ClusterQueue's GPUs held by bound pods (not finished, not being
  deleted) are at most its nominal quota plus what it may borrow then (the other ClusterQueue's
  nominal quota it leaves unused, at most the borrowing limit); nominal quotas and limits read
  from the API server, and the borrower's bound GPUs above its nominal quota at some moment;
- whole gangs: at every moment each gang held both of its members' GPUs or neither, its binds
  landing and its deletion under way aside (``kueue.partly_bound``): the preempted gang went
  from two to none, and no gang stayed at one; every bound pod's Job was admitted.

The module runs on a control plane of its own (Kueue's webhooks fail closed and gate the pods of
every namespace it manages)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from contracts import names
from tests.integration import kueue
from tests.integration.history import History, State

# The module's own control plane with Kueue, its namespaces and queues (pytest fixtures).
from tests.integration.kueue import (  # noqa: F401
    GROUP,
    VERSION,
    Queues,
    kueue_devcluster,
    kueue_namespace,
    kueue_queues,
    kueue_running,
    kueue_webhook_network,
    kueue_workload_history,
)
from tests.integration.scheduler.conftest import Pods, Pool, SchedulerProcess
from tests.waiting import eventually

_UNAVAILABLE = kueue.unavailable()
pytestmark = pytest.mark.skipif(_UNAVAILABLE is not None, reason=_UNAVAILABLE or "")

LENDER, BORROWER = "lender", "borrower"
SIZE, GPUS = 2, 4  # each job: two workers of four GPUs, one gang
LENDER_GPUS, BORROWER_GPUS, BORROWING_LIMIT = 16, 8, 8
BORROWED = ("b1", "b2", "b3")
LENT = ("a1", "a2")


def _admitted_jobs(history: History, jobs: Mapping[str, Any]) -> set[str]:
    """The jobs whose Workload was admitted at some moment the watch recorded."""
    uids = {job.metadata.uid: name for name, job in jobs.items()}
    return {
        uids[owner]
        for state in history.states()
        for workload in state.values()
        if kueue.admitted(workload)
        for owner in kueue.owners(workload)
        if owner in uids
    }


def _preempted(history: History, reason: str) -> dict[str, dict[str, Any]]:
    """Each Workload ever ``Preempted`` for ``reason``, at its first version that was."""
    found: dict[str, dict[str, Any]] = {}
    for state in history.states():
        for name, workload in state.items():
            condition = kueue.condition(workload, "Preempted")
            if (
                condition is not None
                and condition["status"] == "True"
                and condition.get("reason") == reason
            ):
                found.setdefault(name, workload)
    return found


def _held(state: State, jobs: set[str]) -> int:
    return sum(
        kueue.gpus_of(pod)
        for pod in state.values()
        if (pod.metadata.labels or {}).get(kueue.JOB_NAME_LABEL) in jobs and kueue.holds(pod)
    )


def _over_quota(
    state: State, teams: Mapping[str, set[str]], quotas: Mapping[str, tuple[int, int | None]]
) -> list[str]:
    """Each ClusterQueue (by its LocalQueue) whose bound GPUs exceed its nominal quota plus what
    it may borrow at this moment."""
    held = {team: _held(state, jobs) for team, jobs in teams.items()}
    over = []
    for team, (nominal, limit) in quotas.items():
        unused = sum(max(0, quotas[o][0] - held[o]) for o in quotas if o != team)
        may_borrow = unused if limit is None else min(limit, unused)
        if held[team] > nominal + may_borrow:
            over.append(f"{team}: {held[team]} GPUs bound, nominal {nominal} + {may_borrow}")
    return over


def _bound_whole(pods: Pods, name: str) -> bool:
    return len(kueue.bound_of_job(pods, name)) == SIZE


def test_borrowing_within_a_cohort_and_reclaim_by_the_lender_bind_whole_gangs_within_quota(
    queues: Queues,
    pool: Pool,
    *,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    pod_history: History,
    workload_history: History,
) -> None:
    pool.add(3, gpus=8)
    cohort = f"co-{pods.namespace}"
    queues.make(LENDER_GPUS, local=LENDER, cohort=cohort, preemption={"reclaimWithinCohort": "Any"})
    queues.make(BORROWER_GPUS, local=BORROWER, cohort=cohort, borrowing_limit=BORROWING_LIMIT)
    custom = kueue.custom(pods.devcluster)
    queue_history = History(custom.list_cluster_custom_object, GROUP, VERSION, "clusterqueues")
    try:
        _story(
            queues,
            pods,
            start_scheduler=start_scheduler,
            pod_history=pod_history,
            workload_history=workload_history,
            queue_history=queue_history,
        )
    finally:
        queue_history.close()


def _story(
    queues: Queues,
    pods: Pods,
    *,
    start_scheduler: Callable[..., SchedulerProcess],
    pod_history: History,
    workload_history: History,
    queue_history: History,
) -> None:
    start_scheduler()
    jobs: dict[str, Any] = {}

    # 1. The borrower alone: two jobs admitted (one on borrowed quota), the third waits.
    for name in BORROWED:
        jobs[name] = kueue.submit(pods, BORROWER, name, size=SIZE, gpus=GPUS)

    def two_admitted_and_bound() -> list[str] | None:
        admitted = _admitted_jobs(workload_history, jobs)
        whole = [name for name in admitted if _bound_whole(pods, name)]
        return sorted(whole) if len(admitted) == 2 and len(whole) == 2 else None

    running = eventually(two_admitted_and_bound, what="two borrower jobs admitted and bound")
    [waiting] = [name for name in BORROWED if name not in running]
    message = eventually(
        lambda: kueue.pending_message(pods.devcluster, pods.namespace, jobs[waiting].metadata.uid),
        what=f"Kueue to say why {waiting} waits",
    )
    assert names.GPU_RESOURCE in message, message
    borrower_queue = queues.cluster_queues[BORROWER]
    eventually(
        lambda: any(
            kueue.borrowed_gpus(state[borrower_queue]) == BORROWING_LIMIT
            for state in queue_history.states()
            if borrower_queue in state
        ),
        what=f"the borrower's ClusterQueue to say it borrows {BORROWING_LIMIT} GPUs",
    )

    # 2. The lender takes its quota back.
    jobs["a1"] = kueue.submit(pods, LENDER, "a1", size=SIZE, gpus=GPUS)
    eventually(lambda: _bound_whole(pods, "a1"), what="a1 admitted on unused quota and bound")
    assert not _preempted(workload_history, "InCohortReclamation"), "a1 needed no preemption"
    jobs["a2"] = kueue.submit(pods, LENDER, "a2", size=SIZE, gpus=GPUS)
    preempted = eventually(
        lambda: _preempted(workload_history, "InCohortReclamation"),
        what="Kueue to preempt a borrower's job to give the lender its quota back",
    )
    [victim_workload] = preempted.values()
    [victim] = [
        name for name in running if jobs[name].metadata.uid in kueue.owners(victim_workload)
    ]
    evicted = kueue.condition(victim_workload, "Evicted")
    assert evicted is not None
    assert evicted["reason"] == "Preempted", evicted
    eventually(
        lambda: [
            e
            for e in pods.devcluster.core().list_namespaced_event(pods.namespace).items
            if e.reason == "Preempted"
            and e.involved_object.kind == "Workload"
            and e.involved_object.name == victim_workload["metadata"]["name"]
        ],
        what=f"the Preempted Event on {victim}'s Workload",
    )
    eventually(lambda: _bound_whole(pods, "a2"), what="a2 admitted in the room and bound whole")
    [kept] = [name for name in running if name != victim]
    assert _bound_whole(pods, kept), f"{kept} lost a member while {victim} was preempted"

    # 3. The lender's idle quota is borrowed again.
    kueue.deactivate(pods.devcluster, pods.namespace, jobs["a1"].metadata.uid)
    again = eventually(
        lambda: [name for name in (victim, waiting) if _bound_whole(pods, name)],
        what="a waiting borrower job admitted on the lender's idle quota and bound whole",
    )
    assert len(again) == 1, again

    # What the watches recorded, start to finish.
    pod_history.caught_up()
    workload_history.caught_up()
    states = pod_history.states()
    teams = {LENDER: set(LENT), BORROWER: set(BORROWED)}
    quotas = {team: queues.gpu_quota(team) for team in teams}
    assert quotas == {
        LENDER: (LENDER_GPUS, None),
        BORROWER: (BORROWER_GPUS, BORROWING_LIMIT),
    }
    over = [(i, o) for i, state in enumerate(states) for o in _over_quota(state, teams, quotas)]
    assert not over, f"GPUs bound beyond a ClusterQueue's quota: {over[:5]}"
    peak = max(_held(state, teams[BORROWER]) for state in states)
    assert peak == BORROWER_GPUS + BORROWING_LIMIT, f"the borrower never borrowed: {peak}"
    partial = kueue.partly_bound(states, dict.fromkeys(jobs, SIZE))
    assert not partial, f"gangs left partly bound: {partial}"

    admitted = _admitted_jobs(workload_history, jobs)
    for name, pod in kueue.ever_bound(pod_history).items():
        job = (pod.metadata.labels or {}).get(kueue.JOB_NAME_LABEL)
        assert job in admitted, f"{name} bound for {job}, whose Workload was never admitted"
