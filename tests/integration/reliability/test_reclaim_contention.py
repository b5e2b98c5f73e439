"""Several waiting pods reclaiming from one elastic gang, on the devcluster: each gets a victim of
its own, every victim is asked to leave once, and all of them bind.

Two equal-priority 8-GPU pods waiting for room once chose the same surplus member: each cycle
asked it again for the other one and pushed its ``shoal.dev/leave-by`` 30 s later, so it was
never evicted and neither pod bound (37 ``Reclaimed`` Events in 40 s). Now a victim asked to
leave is spent: nobody asks it again or moves its leave-by, and the next waiting pod counts the
room it will free (held for the first one) and asks a victim of its own.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from contracts import names
from tests import figures
from tests.integration.history import History, State
from tests.integration.scheduler.conftest import Pods, Pool, SchedulerProcess
from tests.waiting import eventually

pytestmark = pytest.mark.reliability

SECTION = "reclaim contention"
#: The scheduler evicts a victim this many seconds after asking it to leave (no worker here
#: acknowledges), so every waiting pod should be bound well within two of them.
GRACE = 10.0


def _reclaimed(pods: Pods) -> Counter[str]:
    """``Reclaimed`` Events per pod of the test's namespace (an Event's ``count`` included)."""
    listed = pods.devcluster.core().list_namespaced_event(
        pods.namespace, field_selector="reason=Reclaimed"
    )
    counts: Counter[str] = Counter()
    for event in listed.items:
        counts[event.involved_object.name] += event.count or 1
    return counts


def _gpus(pod: Any) -> int:
    return sum(
        int((c.resources.limits or {}).get(names.GPU_RESOURCE, 0)) for c in pod.spec.containers
    )


def _most_gpus_on_a_node(state: State) -> int:
    """The most GPUs the pods bound to one node ask for (terminating pods included)."""
    per_node: Counter[str] = Counter()
    for pod in state.values():
        if pod.spec.node_name:
            per_node[pod.spec.node_name] += _gpus(pod)
    return max(per_node.values(), default=0)


def _leave_bys(history: History, name: str) -> list[str]:
    """Every ``shoal.dev/leave-by`` the pod ``name`` carried, in order, without repeats."""
    seen: list[str] = []
    for version in history.versions(name):
        value = (version.metadata.annotations or {}).get(names.LEAVE_BY_ANNOTATION)
        if value is not None and (not seen or seen[-1] != value):
            seen.append(value)
    return seen


@pytest.mark.parametrize("waiting", [2, 3], ids=["two", "three"])
def test_waiting_pods_reclaiming_from_one_gang_each_get_a_victim_and_all_bind(
    pool: Pool,
    pods: Pods,
    pod_history: History,
    start_scheduler: Callable[..., SchedulerProcess],
    waiting: int,
) -> None:
    nodes = 2 + waiting  # the gang's minimum, and one surplus member per waiting pod
    pool.add(nodes, gpus=8)
    members = pods.gang("elastic", nodes, gpus=8, min_member=2, max_member=nodes)
    start_scheduler("--reclaim-grace", str(GRACE))
    eventually(
        lambda: len(pods.bound(members)) == nodes,
        what="the elastic gang at its maximum, one member per node",
    )

    started = time.monotonic()
    wanting = [pods.create(f"want-{i}", gpus=8) for i in range(waiting)]
    deadline = started + 2 * GRACE
    eventually(
        lambda: len(pods.bound(wanting)) == waiting,
        timeout=max(0.0, deadline - time.monotonic()),
        what=f"all {waiting} waiting pods bound within two reclaim graces",
    )
    took = time.monotonic() - started

    # Each waiting pod had a victim of its own, asked once: its leave-by never moved.
    def every_victim_told() -> Counter[str] | None:
        counts = _reclaimed(pods)
        return counts if len(counts) >= waiting else None

    counts = eventually(every_victim_told, timeout=30, what="a Reclaimed Event on every victim")
    assert set(counts) <= set(members), counts
    assert dict(counts) == {victim: 1 for victim in counts}, counts
    assert len(counts) == waiting, counts
    pod_history.caught_up()
    for victim in counts:
        assert len(_leave_bys(pod_history, victim)) == 1, _leave_bys(pod_history, victim)
    # The elastic gang kept its minimum, and no node ever held more GPUs than it has, not even
    # while a victim was terminating.
    assert len(pods.bound(members)) == nodes - waiting
    assert max(_most_gpus_on_a_node(state) for state in pod_history.states()) <= 8

    figures.record(
        SECTION, f"{waiting} waiting pods all bound (s, grace {GRACE:.0f} s)", round(took, 1)
    )
    figures.record(
        SECTION, f"{waiting} waiting pods: Reclaimed Events per victim", max(counts.values())
    )
    print(f"{waiting} waiting pods bound after {took:.1f} s; Reclaimed per victim: {dict(counts)}")
