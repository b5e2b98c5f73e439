"""A leader that was paused wakes up fenced: it writes nothing once a standby may lead.

Two replicas with leader election on short Lease timings. The leader is stopped (SIGSTOP: what
a long garbage collection or a frozen VM looks like from outside) for longer than the Lease,
while gangs keep arriving; the standby takes over and binds them. Then the old leader is let go
on (SIGCONT) with gangs still arriving and a cache that is a pause out of date. Its elector
still says "leading" for a renew deadline; without the fence it binds in that time, races the
new leader for the same gangs and can place pods on GPUs the new leader has given away.

Who bound a pod is read from the API server: each bind is followed by a ``Scheduled`` Event
whose ``reportingInstance`` names the scheduler process that bound it. The old leader is quiet
when it is stopped (every pod it bound has its Event, nothing is queued), so after it wakes it
must add no ``Scheduled`` Event, every pod bound from then on must have the new leader's, and
no node may hold more GPUs than it has.
"""

from __future__ import annotations

import signal
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from contracts import names
from tests import figures
from tests.integration.reliability.owncluster import GangMaker, metrics
from tests.integration.scheduler.conftest import Pods, Pool, SchedulerProcess
from tests.waiting import eventually

pytestmark = pytest.mark.reliability

#: Room for every gang the stream makes (gangs of 2 pods x 2 GPUs: 4 gangs per node).
NODES, GPUS_PER_NODE = 24, 8
GANG_SIZE, GANG_GPUS = 2, 2
#: Short Lease timings, so that the test takes seconds: lease, renew deadline, retry period.
LEASE, RENEW, RETRY = 4, 3, 1
#: Gangs the new leader binds while the old one is stopped, before it is let go on.
PAUSED_GANGS = 3
TIMINGS = (
    *("--leader-elect-lease-duration", str(LEASE)),
    *("--leader-elect-renew-deadline", str(RENEW)),
    *("--leader-elect-retry-period", str(RETRY)),
)


@contextmanager
def stopped(scheduler: SchedulerProcess) -> Iterator[Callable[[], float]]:
    """The process is stopped inside the block; calling what it yields lets it go on (and
    returns the wall-clock time it did). It is let go on at the end in any case."""
    assert scheduler.proc is not None
    proc = scheduler.proc
    proc.send_signal(signal.SIGSTOP)
    resumed: list[float] = []

    def resume() -> float:
        if not resumed:
            proc.send_signal(signal.SIGCONT)
            resumed.append(time.time())
        return resumed[0]

    try:
        yield resume
    finally:
        if proc.poll() is None:
            resume()


def _scheduled(pods: Pods) -> dict[str, list[str]]:
    """Pod -> the ``reportingInstance`` of each ``Scheduled`` Event about it."""
    listed = pods.devcluster.core().list_namespaced_event(
        pods.namespace, field_selector="reason=Scheduled"
    )
    by_pod: dict[str, list[str]] = defaultdict(list)
    for event in listed.items:
        by_pod[event.involved_object.name].append(str(event.reporting_instance))
    return by_pod


def _bound(pods: Pods) -> dict[str, tuple[str, int]]:
    """Pod -> (node, GPUs) for every bound pod of the test."""
    found = {}
    for pod in pods.all():
        if pod.spec.node_name:
            limits = pod.spec.containers[0].resources.limits or {}
            found[pod.metadata.name] = (pod.spec.node_name, int(limits.get(names.GPU_RESOURCE, 0)))
    return found


def _over_committed(pods: Pods, nodes: list[str], bound: dict[str, tuple[str, int]]) -> Any:
    """Nodes whose bound pods ask for more GPUs than the node's allocatable: node -> (asked,
    allocatable)."""
    core = pods.devcluster.core()
    allocatable = {
        node: int(core.read_node(node).status.allocatable.get(names.GPU_RESOURCE, "0"))
        for node in nodes
    }
    asked: dict[str, int] = defaultdict(int)
    for node, gpus in bound.values():
        asked[node] += gpus
    return {
        node: (n, allocatable.get(node, 0))
        for node, n in asked.items()
        if n > allocatable.get(node, 0)
    }


def _told(pods: Pods, pod_names: set[str]) -> dict[str, list[str]] | None:
    """The ``Scheduled`` Events once every pod in ``pod_names`` has one, else ``None``."""
    told = _scheduled(pods)
    return told if all(told.get(p) for p in pod_names) else None


def test_a_paused_leader_wakes_up_fenced_and_binds_nothing(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    nodes = pool.add(NODES, gpus=GPUS_PER_NODE)
    flags = ("--leader-elect", "true", "--lease-namespace", pods.namespace, *TIMINGS)
    first = start_scheduler(*flags)
    eventually(lambda: first.get("/readyz") == (200, "leader\n"), what="a leader")
    second = start_scheduler(*flags)
    assert second.get("/readyz") == (200, "standby\n")

    # The leader binds a few gangs and goes quiet: every bind told, nothing queued.
    maker = GangMaker(pods, size=GANG_SIZE, gpus=GANG_GPUS, interval=0.25)
    maker.limit = NODES * GPUS_PER_NODE // (GANG_SIZE * GANG_GPUS) - 2
    for _ in range(4):
        maker.one()
    before = {p for _, members in maker.made.values() for p in members}
    eventually(lambda: before <= set(_bound(pods)), what="the first gangs bound")
    told = eventually(lambda: _told(pods, before), what="the first binds' Scheduled Events")
    old_instances = {i for p in before for i in told[p]}
    assert len(old_instances) == 1, old_instances
    eventually(
        lambda: metrics(first).get("shoal_scheduler_status_backlog") == 0,
        what="the leader's status writes to finish",
    )

    with stopped(first) as resume:
        paused_at = time.monotonic()
        maker.phase = "paused"
        maker.start()
        eventually(
            lambda: second.get("/readyz") == (200, "leader\n"),
            timeout=LEASE + 4 * RETRY + 30,
            interval=0.1,
            what="the standby to take the Lease",
        )
        takeover = time.monotonic() - paused_at

        def paused_gangs_bound() -> bool:
            bound = _bound(pods)
            whole = [
                members
                for phase, members in list(maker.made.values())
                if phase == "paused" and all(m in bound for m in members)
            ]
            return len(whole) >= PAUSED_GANGS

        eventually(paused_gangs_bound, interval=0.1, what="the new leader to bind gangs")
        paused_for = time.monotonic() - paused_at
        # Gangs keep coming: the old leader has work the moment it wakes.
        maker.phase = "resumed"
        resume()
        resumed_at = time.monotonic()

    proc = first.proc
    assert proc is not None
    eventually(lambda: proc.poll() is not None, timeout=60, what="the old leader to exit")
    exited_after = time.monotonic() - resumed_at
    maker.stop()
    made = {p for _, members in maker.made.values() for p in members}
    assert maker.by_phase().get("resumed", 0) > 0, "no gang arrived after the old leader woke"

    eventually(lambda: made <= set(_bound(pods)), what="every gang bound by the new leader")
    bound = _bound(pods)
    told = eventually(lambda: _told(pods, set(bound)), what="a Scheduled Event for every bind")

    over = _over_committed(pods, nodes, bound)
    twice = sorted(p for p, by in told.items() if len(by) > 1)
    by_old = sorted(p for p, by in told.items() if old_instances & set(by) and p not in before)
    by_new = sorted(p for p, by in told.items() if not old_instances & set(by))
    lines = first.log_lines()
    timings = f"{LEASE} / {RENEW} / {RETRY}"
    figures.record("paused leader", "lease / renew deadline / retry period s", timings)
    figures.record("paused leader", "stop -> standby leads s", round(takeover, 2))
    figures.record("paused leader", "leader stopped for s", round(paused_for, 2))
    figures.record("paused leader", "resume -> old leader exits s", round(exited_after, 2))
    figures.record("paused leader", "pods bound by the old leader after it woke", len(by_old))
    figures.record("paused leader", "pods bound by the new leader", len(by_new))
    figures.record("paused leader", "nodes over-committed", len(over))
    print(
        f"\npaused leader: standby leads {takeover:.2f} s after the stop, old leader let go on "
        f"after {paused_for:.2f} s and exited {exited_after:.2f} s later; pods bound by it after "
        f"it woke: {len(by_old)}; by the new leader: {len(by_new)}; over-committed nodes: "
        f"{len(over)}"
    )
    assert not by_old, f"the old leader bound {by_old} after it woke"
    assert not over, f"GPUs over-committed (asked, allocatable): {over}"
    assert not twice, f"pods with two Scheduled Events: {twice}"
    assert any(line.get("event") == "leadership_lost_exiting" for line in lines)
    assert any(line.get("event") == "lease_not_held_writes_stopped" for line in lines)
