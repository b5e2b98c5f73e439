"""Elastic growth and topology-aware placement on a real API server."""

from __future__ import annotations

from collections.abc import Callable

from contracts import names
from tests.integration.history import History, State
from tests.integration.scheduler.conftest import Pods, Pool, SchedulerProcess, ensure_priority_class
from tests.waiting import eventually


def test_elastic_gang_gets_its_minimum_then_grows_when_nodes_are_added(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    pool.add(2, gpus=8, prefix="first")
    members = pods.gang("elastic", 4, gpus=8, min_member=2, max_member=4)
    start_scheduler()
    eventually(lambda: len(pods.bound(members)) == 2, what="the minimum of 2 members")
    pool.add(2, gpus=8, prefix="more")
    eventually(lambda: len(pods.bound(members)) == 4, what="growth to the maximum of 4")
    assert len(set(pods.bound(members).values())) == 4


def test_gang_that_fits_one_rack_lands_in_one_rack(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    # rack "small": three 4-GPU nodes (each a tight fit for a 4-GPU pod, but 12 GPUs in all);
    # rack "big": three 8-GPU nodes. Four 4-GPU members fit only in "big" as one rack.
    small = pool.add(3, gpus=4, prefix="small", extra_labels={names.RACK_LABEL: "small"})
    big = pool.add(3, gpus=8, prefix="big", extra_labels={names.RACK_LABEL: "big"})
    members = pods.gang("racked", 4, gpus=4)
    start_scheduler()
    placed = eventually(
        lambda: pods.bound(members) if len(pods.bound(members)) == 4 else None,
        what="the gang to be bound",
    )
    assert set(placed.values()) <= set(big)
    assert not set(placed.values()) & set(small)


def test_topology_required_gang_waits_rather_than_spread(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    pool.add(1, gpus=8, prefix="a", extra_labels={names.RACK_LABEL: "a"})
    pool.add(1, gpus=8, prefix="b", extra_labels={names.RACK_LABEL: "b"})
    members = pods.gang(
        "together",
        2,
        gpus=8,
        annotations={names.TOPOLOGY_REQUIRED_ANNOTATION: names.RACK_LABEL},
    )
    start_scheduler()

    def explained() -> str | None:
        condition = pods.condition(members[0])
        return condition.message if condition is not None else None

    message = eventually(explained, what="the waiting gang's condition")
    assert "no single shoal.dev/rack has room for all 2 member(s)" in message
    assert pods.bound(members) == {}
    # A rack that can hold both appears: the gang goes there, whole.
    roomy = pool.add(2, gpus=8, prefix="c", extra_labels={names.RACK_LABEL: "c"})
    placed = eventually(
        lambda: pods.bound(members) if len(pods.bound(members)) == 2 else None,
        what="the gang in the new rack",
    )
    assert set(placed.values()) == set(roomy)


def test_four_gpu_pod_lands_on_a_free_nvlink_island_not_on_scattered_gpus(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    # Both nodes have 4 GPUs free. On "scattered" they are 2 + 2 across two NVLink islands; on
    # "island" they are one whole island. Names are chosen so that name order favours the wrong
    # node, and the GPU count is a tie.
    scattered = pool.add_manifest(
        pool.node_with_allocated("a-scattered", {0: "x/a", 1: "x/a", 4: "x/b", 5: "x/b"})
    )
    island = pool.add_manifest(
        pool.node_with_allocated("z-island", {0: "x/c", 1: "x/c", 2: "x/c", 3: "x/c"})
    )
    start_scheduler()
    pod = pods.create("four", gpus=4)
    node = eventually(lambda: pods.node_of(pod), what="the 4-GPU pod to be bound")
    assert node == island
    assert node != scattered


def test_elastic_gang_shrinks_for_a_higher_priority_gang_never_below_its_minimum(
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    pod_history: History,
) -> None:
    ensure_priority_class(pods.devcluster, "shoal-test-high", 100000)
    pool.add(4, gpus=8)
    members = pods.gang("elastic", 4, gpus=8, min_member=2, max_member=4)
    start_scheduler("--reclaim-grace", "3")
    eventually(lambda: len(pods.bound(members)) == 4, what="the elastic gang at its maximum")

    urgent = pods.gang("urgent", 2, gpus=8, min_member=2, priority_class="shoal-test-high")
    eventually(
        lambda: len(pods.bound(urgent)) == 2, what="the high-priority gang to take the surplus room"
    )

    # Read from every version of the pods (a victim's leave-by lasts only until its eviction).
    def bound(state: State) -> int:
        return len([n for n in members if n in state and state[n].spec.node_name])

    lowest = pod_history.lowest(bound, since=lambda state: bound(state) == 4)
    assert lowest >= 2  # never below the minimum while members were bound
    assert len(pods.bound(members)) == 2
    asked = set()
    for name in members:
        for pod in pod_history.versions(name):
            notes = pod.metadata.annotations or {}
            if names.LEAVE_BY_ANNOTATION in notes:
                asked.add(name)
                assert notes[names.RECLAIMED_FOR_ANNOTATION].endswith("/urgent")
    assert asked == {"elastic-2", "elastic-3"}  # the youngest surplus members, and only them
    reclaimed = [e for e in pods.events("elastic-3") if e.reason == "Reclaimed"]
    assert reclaimed
    assert "to make room for gang" in reclaimed[0].message


def test_quorum_on_demand_surplus_on_spot_and_revoking_nodes_avoided(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    # One rack, so that only the capacity type tells the nodes apart.
    rack = {names.RACK_LABEL: "one"}
    on_demand = pool.add(2, gpus=8, prefix="od", extra_labels=rack)
    spot = pool.add(
        1,
        gpus=8,
        prefix="spot",
        extra_labels={
            **rack,
            names.CAPACITY_TYPE_LABEL: "spot",
            "karpenter.sh/capacity-type": "spot",
        },
    )
    [revoking] = pool.add(1, gpus=8, prefix="rev", extra_labels=rack)
    node = pods.devcluster.core().read_node(revoking)
    taints = [
        *(node.spec.taints or []),
        {"key": names.REVOKING_TAINT, "value": "aws", "effect": "NoSchedule"},
    ]
    pods.devcluster.core().patch_node(revoking, {"spec": {"taints": taints}})
    members = pods.gang("elastic", 4, gpus=8, min_member=2, max_member=4)
    start_scheduler()

    placed = eventually(
        lambda: pods.bound(members) if len(pods.bound(members)) == 3 else None,
        what="the quorum and one surplus member",
    )
    # The two oldest members are the quorum: on on-demand nodes; the surplus one is on spot.
    assert {placed["elastic-0"], placed["elastic-1"]} == set(on_demand)
    assert placed["elastic-2"] == spot[0]
    assert revoking not in placed.values()

    def explained() -> str | None:
        condition = pods.condition("elastic-3")
        return condition.message if condition is not None else None

    assert "1 node(s) revoking" in eventually(explained, what="why the last member waits")
