"""A pod that opened a notice watch is a worker until it leaves, whatever later copies of it say,
and after the agent restarts.

On a real node (tests/integration/realnode), a worker container that heard a spot notice and
had not acknowledged it yet was evicted three seconds later as ``drain``: the agent's own
annotation on the pod came back through the pod watch, and the fresh copy, whose labels do not
say "worker", replaced the one the watch had marked.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nodeagent.adapters.calls import ApiCalls
from nodeagent.adapters.podcache import PodCache
from nodeagent.core.events import EventId, EvictPod, Kind, Notice, Pod, PodKey, PodUid, Tracked
from nodeagent.core.store import Store
from nodeagent.wiring.pods import PodList
from tests.unit.nodeagent.scripted_feed import until

pytestmark = pytest.mark.reliability

T0 = datetime(2026, 12, 2, 7, 0, 0, tzinfo=UTC)
DEADLINE = T0 + timedelta(minutes=4)


def spot() -> Notice:
    return Notice(
        event_id=EventId("aws-spot-terminate"),
        source="aws",
        channel="aws/spot",
        kind=Kind.TERMINATE,
        deadline=DEADLINE,
        reason="EC2 spot interruption: terminate",
    )


def copy(annotated: bool = False) -> Pod:
    """The pod as the API server lists it: nothing in its labels says it is a worker."""
    return Pod(
        key=PodKey("team/worker"),
        uid=PodUid("uid-worker"),
        worker=False,
        leave_by=DEADLINE if annotated else None,
    )


def evictions(store: Store, now: datetime) -> list[EvictPod]:
    found = []
    for action in store.due(now):
        store.record(action, ok=True, now=now)
        if isinstance(action, EvictPod):
            found.append(action)
    return found


def test_a_watching_worker_is_not_drained_when_a_new_copy_of_its_pod_arrives() -> None:
    store = Store()
    store.set_pods([copy()])
    store.mark_worker(PodUid("uid-worker"))
    store.observe("aws/spot", [spot()], T0)
    assert evictions(store, T0) == []  # told, not evicted: it may checkpoint first

    store.set_pods([copy(annotated=True)])  # the agent's own annotation, back from the watch
    pod = store.pod(PodUid("uid-worker"))
    assert pod is not None
    assert pod.worker
    assert evictions(store, T0 + timedelta(seconds=3)) == []


class Cluster:
    """The reads a restore makes: no notice recorded on the node, and the pods listed."""

    last_ok = 0.0
    dry_run = False

    def __init__(self, pods: list[Pod]) -> None:
        self.pods = pods

    def read_revocation(self) -> list[Tracked]:
        return []

    def list_pods(self) -> list[Pod]:
        return list(self.pods)


def pod_list(store: Store, cluster: Cluster, path: Path) -> PodList:
    return PodList(
        store,
        cluster,  # type: ignore[arg-type]  # only the reads a restore makes are used
        ApiCalls(timeout=5, concurrency=1),
        clock=lambda: T0,
        wake=lambda: None,
        pod_file=PodCache(path, "real-0"),
    )


async def test_an_agent_restarted_under_a_notice_knows_its_workers_before_they_watch_again(
    tmp_path: Path,
) -> None:
    """On a real node the agent's container was killed under a spot notice; the restarted agent
    drained the worker at once, a moment before its watch came back: the pod file had kept the
    pods as the API server lists them, without the mark their watch had given them."""
    path = tmp_path / "pods.json"
    cluster = Cluster([copy()])
    first = Store()
    before = pod_list(first, cluster, path)
    await before.restore()
    first.mark_worker(PodUid("uid-worker"))
    cluster.pods = [copy(annotated=True)]  # the notice's annotation, a change that is saved
    await before.refresh()
    await until(lambda: path.is_file() and '"worker":true' in path.read_text())
    await before.stop()

    restarted = Store()
    after = pod_list(restarted, cluster, path)
    after.load_file()
    await after.restore()
    pod = restarted.pod(PodUid("uid-worker"))
    assert pod is not None
    assert pod.worker
    restarted.observe("aws/spot", [spot()], T0)
    assert evictions(restarted, T0) == []
    await after.stop()
