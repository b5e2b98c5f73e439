"""A notice that reaches the agent with less time than the evict margin, or past its deadline:
its pods are evicted at once through the Eviction API (never deleted first, so a Job's
``podFailurePolicy`` sees ``DisruptionTarget``), and the pod's Event says how late it came."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from nodeagent.core.events import DeletePod, EvictPod, Late, NotifyPod, PodKey
from nodeagent.core.store import Settings, Store
from nodeagent.wiring.executor import LATE_NOTICE_REASON
from tests.unit.nodeagent.notice_socket import PODS, SocketAgent
from tests.unit.nodeagent.notice_socket import notice as spot
from tests.unit.nodeagent.test_store import T0, at, notice, pod, run

pytestmark = pytest.mark.reliability


def test_a_notice_past_its_deadline_evicts_at_once_and_never_deletes_first() -> None:
    store = Store()
    store.set_pods([pod("w0"), pod("web", worker=False)])
    store.observe("aws", [notice(lead=-30)], T0)  # seen 30 s after its deadline
    told = run(store, T0)
    assert {a.pod.key for a in told if isinstance(a, NotifyPod)} == {"ns/w0", "ns/web"}
    evicted = run(store, T0)
    assert [type(a) for a in evicted] == [EvictPod, EvictPod]
    for action in evicted:
        assert isinstance(action, EvictPod)
        assert action.late == Late(notice=action.notice, seen=T0, margin=timedelta(seconds=15))
    first = evicted[0]
    assert isinstance(first, EvictPod)
    assert first.late is not None
    message = first.late.message()
    assert message.startswith(
        "The deadline 2026-11-30T09:59:30Z had passed when the agent saw it (2026-11-30T10:00:00Z)"
    )
    assert message.endswith("evicted at once")
    # The evictions were accepted in the last seconds: no delete follows them.
    assert run(store, at(30)) == []


def test_a_notice_shorter_than_the_margin_says_how_much_was_left() -> None:
    store = Store()
    store.set_pods([pod("w0")])
    store.observe("aws", [notice(lead=9.5)], T0)  # deadline rounded down: 9 s left
    run(store, T0)
    (evict,) = run(store, T0)
    assert isinstance(evict, EvictPod)
    assert evict.late is not None
    assert evict.late.message().startswith(
        "Only 9 s left, less than the 15 s margin, when the agent saw the notice "
        "(leave by 2026-11-30T10:00:09Z)"
    )


def test_a_notice_seen_in_time_is_not_late() -> None:
    store = Store()
    store.set_pods([pod("w0")])
    store.observe("aws", [notice(lead=15)], T0)  # exactly the margin
    run(store, T0)
    (evict,) = run(store, T0)
    assert isinstance(evict, EvictPod)
    assert evict.late is None
    assert evict.why == "deadline"


def test_past_the_deadline_a_refused_eviction_is_followed_by_the_delete() -> None:
    store = Store(settings=Settings(evict_retry=timedelta(seconds=5)))
    store.set_pods([pod("w0")])
    store.observe("aws", [notice(lead=-30)], T0)
    run(store, T0)
    (evict,) = store.due(T0)
    assert isinstance(evict, EvictPod)
    store.record(evict, ok=False, now=T0)  # a PodDisruptionBudget said no
    assert store.due(at(4)) == []
    assert [type(a) for a in store.due(at(5))] == [DeletePod]


def test_an_eviction_accepted_before_the_delete_margin_is_still_shortened() -> None:
    store = Store()
    store.set_pods([pod("w0")])
    store.observe("aws", [notice(lead=120)], T0)
    run(store, T0)
    store.acknowledge(PodKey("ns/w0"), pod("w0").uid, 3)
    assert [type(a) for a in run(store, at(1))] == [EvictPod]
    assert [type(a) for a in run(store, at(115))] == [DeletePod]


def test_the_evicted_pod_gets_a_late_notice_event(tmp_path: Path) -> None:
    node = SocketAgent(tmp_path / "agent.sock")
    node.start()
    try:
        with capture_logs() as logs:
            node.observe([spot(lead=timedelta(seconds=-30))])
            node.until(lambda: len(node.cluster.warned) == 2, "both pods were told")
        assert sorted(key for key, _ in node.cluster.evicted) == [f"{ns}/{n}" for ns, n, _ in PODS]
        assert node.cluster.deleted == []
        for _key, reason, message in node.cluster.warned:
            assert reason == LATE_NOTICE_REASON
            assert "had passed when the agent saw it" in message
        lines = [e for e in logs if e["event"] == "late_notice_evicted"]
        assert {line["passed"] for line in lines} == {True}
    finally:
        node.stop()
