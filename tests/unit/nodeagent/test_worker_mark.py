"""A pod that opened a notice watch is a worker until it leaves, whatever later copies of it say.

On a real node (tests/integration/realnode), a worker container that heard a spot notice and
had not acknowledged it yet was evicted three seconds later as ``drain``: the agent's own
annotation on the pod came back through the pod watch, and the fresh copy, whose labels do not
say "worker", replaced the one the watch had marked.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from nodeagent.core.events import EventId, EvictPod, Kind, Notice, Pod, PodKey, PodUid
from nodeagent.core.store import Store

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
    assert pod is not None and pod.worker
    assert evictions(store, T0 + timedelta(seconds=3)) == []
