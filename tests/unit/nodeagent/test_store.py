"""The store decides what is due from notices, pods and ``now`` alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent.core.events import (
    AckUpstream,
    Action,
    DeletePod,
    EventId,
    EvictPod,
    Kind,
    Notice,
    NotifyPod,
    Pod,
    PodKey,
    PodUid,
    SyncNode,
    Tracked,
    WithdrawPod,
)
from nodeagent.core.store import (
    AckOutcome,
    Settings,
    ShortNotice,
    Store,
    reclaim_notice,
    short_notice,
)

T0 = datetime(2026, 11, 30, 10, 0, 0, tzinfo=UTC)


def notice(
    event_id: str = "aws-1",
    *,
    source: str = "aws",
    lead: float = 120,
    disruptive: bool = True,
    upstream: str | None = None,
    scope: frozenset[PodKey] | None = None,
) -> Notice:
    return Notice(
        event_id=EventId(event_id),
        source=source,
        channel=source,
        kind=Kind.TERMINATE,
        deadline=T0 + timedelta(seconds=lead),
        reason="spot interruption",
        disruptive=disruptive,
        upstream_id=upstream,
        scope=scope,
    )


def pod(name: str, *, worker: bool = True, daemon: bool = False) -> Pod:
    return Pod(key=PodKey(f"ns/{name}"), uid=PodUid(f"uid-{name}"), worker=worker, daemon=daemon)


def run(store: Store, now: datetime) -> list[Action]:
    """Carry out everything due, successfully, and return what was done."""
    actions = store.due(now)
    for action in actions:
        store.record(action, ok=True, now=now)
    return actions


def settle(store: Store, now: datetime) -> list[Action]:
    """Run until nothing more is due at ``now`` (a late notice: notify, then evict at once)."""
    done: list[Action] = []
    for _ in range(4):
        actions = run(store, now)
        if not actions:
            break
        done += actions
    return done


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_notice_taints_once_and_notifies_each_pod_once() -> None:
    store = Store()
    store.set_pods([pod("w0"), pod("w1")])
    assert store.observe("aws", [notice()], T0) == [EventId("aws-1")]
    first = run(store, T0)
    assert isinstance(first[0], SyncNode)
    assert [type(a) for a in first[1:]] == [NotifyPod, NotifyPod]
    # The same notice polled again is the same notice: nothing new is due.
    assert store.observe("aws", [notice()], at(1)) == []
    assert run(store, at(1)) == []


def test_ack_evicts_that_worker_at_once_and_others_wait_for_the_margin() -> None:
    store = Store()
    store.set_pods([pod("w0"), pod("w1")])
    store.observe("aws", [notice()], T0)
    run(store, T0)
    assert store.acknowledge(PodKey("ns/w0"), PodUid("uid-w0"), 1200) is AckOutcome.ACCEPTED
    evicted = run(store, at(2))
    assert evicted == [EvictPod(pod("w0"), store.governing() or notice(), "acknowledged")]
    assert run(store, at(100)) == []
    late = run(store, at(105))  # deadline 120 s - evict margin 15 s
    assert [(type(a), a.pod.key) for a in late if isinstance(a, EvictPod)] == [(EvictPod, "ns/w1")]


def test_an_ack_cannot_touch_a_pod_that_is_not_under_notice_or_not_here() -> None:
    store = Store()
    store.set_pods([pod("w0")])
    assert store.acknowledge(PodKey("ns/w0"), PodUid("uid-w0"), 1) is AckOutcome.NOT_UNDER_NOTICE
    assert store.acknowledge(PodKey("ns/w9"), PodUid("uid-w9"), 1) is AckOutcome.NOT_ON_NODE
    store.observe("aws", [notice()], T0)
    run(store, T0)
    # Right name, wrong uid: a pod of the same name elsewhere or an earlier incarnation.
    assert store.acknowledge(PodKey("ns/w0"), PodUid("other"), 1) is AckOutcome.NOT_ON_NODE
    assert not any(isinstance(a, EvictPod) for a in run(store, at(1)))


def test_withdrawal_untaints_and_withdraws_pods_not_yet_gone() -> None:
    store = Store()
    store.set_pods([pod("w0")])
    store.observe("gcp", [notice("gcp-1", source="gcp", lead=30)], T0)
    run(store, T0)
    store.observe("gcp", [], at(1))
    actions = run(store, at(1))
    assert actions == [SyncNode(()), WithdrawPod(pod("w0"))]
    assert run(store, at(2)) == []


def test_non_workers_leave_after_workers_and_daemons_never() -> None:
    store = Store()
    store.set_pods([pod("w0"), pod("web", worker=False), pod("agent", daemon=True)])
    store.observe("aws", [notice()], T0)
    notified = run(store, T0)
    assert {a.pod.key for a in notified if isinstance(a, NotifyPod)} == {"ns/w0", "ns/web"}
    store.acknowledge(PodKey("ns/w0"), PodUid("uid-w0"), 5)
    assert [a.pod.key for a in run(store, at(1)) if isinstance(a, EvictPod)] == ["ns/w0"]
    # The worker's eviction was accepted; now the rest of the node drains.
    drained = run(store, at(2))
    assert [(a.pod.key, a.why) for a in drained if isinstance(a, EvictPod)] == [("ns/web", "drain")]


def test_refused_eviction_is_retried_and_delete_is_the_last_resort() -> None:
    store = Store(settings=Settings(evict_retry=timedelta(seconds=5)))
    store.set_pods([pod("w0")])
    store.observe("aws", [notice()], T0)
    run(store, T0)
    store.acknowledge(PodKey("ns/w0"), PodUid("uid-w0"), 1)
    (evict,) = store.due(at(1))
    store.record(evict, ok=False, now=at(1))  # a PodDisruptionBudget said no
    assert store.due(at(3)) == []
    assert store.due(at(6)) == [evict]
    store.record(evict, ok=False, now=at(6))
    assert [type(a) for a in store.due(at(115))] == [DeletePod]


def test_azure_is_acknowledged_once_every_pod_is_out() -> None:
    store = Store()
    store.set_pods([pod("w0")])
    store.observe("azure", [notice("az-1", source="azure", lead=30, upstream="az-1")], T0)
    run(store, T0)
    assert not any(isinstance(a, AckUpstream) for a in store.due(at(1)))
    store.acknowledge(PodKey("ns/w0"), PodUid("uid-w0"), 9)
    actions = run(store, at(1))
    assert [type(a) for a in actions] == [EvictPod, AckUpstream]
    # The node annotation is rewritten to record the upstream ack, then all is quiet.
    assert [type(a) for a in run(store, at(1))] == [SyncNode]
    assert run(store, at(2)) == []


def test_a_restarted_agent_repeats_nothing() -> None:
    first = Store()
    first.set_pods([pod("w0")])
    first.observe("aws", [notice()], T0)
    run(first, T0)
    recorded = first.active()

    second = Store()
    second.restore(recorded)
    annotated = Pod(key=PodKey("ns/w0"), uid=PodUid("uid-w0"), leave_by=recorded[0].notice.deadline)
    second.set_pods([annotated])
    second.observe("aws", [notice()], at(30))
    assert run(second, at(30)) == []
    # Its ack is still honoured after the restart.
    assert second.acknowledge(PodKey("ns/w0"), PodUid("uid-w0"), 3) is AckOutcome.ACCEPTED


@pytest.mark.reliability
def test_a_restarted_agent_still_tells_the_socket_what_the_annotation_already_says() -> None:
    """Restarted under a live notice, the agent writes nothing again (the annotation says the
    pod was told), but a worker whose watch opened before the notice was restored heard "no
    notice": the workers of such a pod are listed as unheard until they are told."""
    first = Store()
    first.set_pods([pod("w0")])
    first.observe("aws", [notice()], T0)
    run(first, T0)
    recorded = first.active()

    second = Store()
    annotated = Pod(key=PodKey("ns/w0"), uid=PodUid("uid-w0"), leave_by=recorded[0].notice.deadline)
    second.set_pods([annotated])
    second.restore(recorded)
    assert not any(isinstance(a, NotifyPod) for a in second.due(at(30)))
    ((uid, told),) = second.unheard()
    assert (uid, told.event_id) == (PodUid("uid-w0"), recorded[0].notice.event_id)
    assert second.heard(uid, told, at=30.0)
    assert second.unheard() == []


def test_a_more_urgent_notice_renotifies_with_the_earlier_deadline() -> None:
    store = Store()
    store.set_pods([pod("w0")])
    store.observe("aws", [notice("maint", lead=3600)], T0)
    run(store, T0)
    store.observe("aws", [notice("maint", lead=3600), notice("spot", lead=120)], at(5))
    actions = run(store, at(5))
    (notify,) = [a for a in actions if isinstance(a, NotifyPod)]
    assert notify.notice.event_id == "spot"


def test_deadline_only_moves_earlier() -> None:
    store = Store()
    store.observe("azure", [notice("az", source="azure", lead=60)], T0)
    store.observe("azure", [notice("az", source="azure", lead=600)], at(1))
    assert store.active()[0].notice.deadline == at(60)
    store.observe("azure", [notice("az", source="azure", lead=10)], at(2))
    assert store.active()[0].notice.deadline == at(10)


def test_non_disruptive_notices_only_cordon() -> None:
    store = Store()
    store.set_pods([pod("w0")])
    store.observe("aws", [notice("rebalance", lead=0, disruptive=False)], T0)
    assert [type(a) for a in run(store, at(1000))] == [SyncNode]


def test_a_notice_scoped_to_a_pod_leaves_the_node_and_other_pods_alone() -> None:
    store = Store()
    store.set_pods([pod("w0"), pod("w1"), pod("web", worker=False)])
    fault = notice("gpu-3", source="gpu", lead=30, scope=frozenset({PodKey("ns/w0")}))
    store.observe("gpu", [fault], T0)
    actions = run(store, T0)
    assert [(type(a), a.pod.key) for a in actions if isinstance(a, NotifyPod)] == [
        (NotifyPod, "ns/w0")
    ]
    assert not any(isinstance(a, SyncNode) for a in actions)  # no taint for a GPU fault
    store.acknowledge(PodKey("ns/w0"), PodUid("uid-w0"), 10)
    assert [a.pod.key for a in run(store, at(1)) if isinstance(a, EvictPod)] == ["ns/w0"]
    # Nothing else is touched, even at the deadline.
    late = run(store, at(29))
    assert {a.pod.key for a in late if not isinstance(a, SyncNode | AckUpstream)} <= {"ns/w0"}


def test_a_pod_follows_the_most_urgent_notice_that_concerns_it() -> None:
    store = Store()
    store.set_pods([pod("w0"), pod("w1")])
    store.observe("aws", [notice("spot", lead=120)], T0)
    fault = notice("gpu-3", source="gpu", lead=30, scope=frozenset({PodKey("ns/w1")}))
    store.observe("gpu", [fault], T0)
    told = {a.pod.key: a.notice.event_id for a in run(store, T0) if isinstance(a, NotifyPod)}
    assert told == {"ns/w0": "spot", "ns/w1": "gpu-3"}


# --- properties -------------------------------------------------------------------------------

ids = st.sampled_from(["a", "b", "c"])
step = st.one_of(
    st.tuples(st.just("observe"), st.frozensets(ids), st.integers(0, 200)),
    st.tuples(st.just("ack"), st.sampled_from(["w0", "w1", "x"]), st.integers(0, 200)),
    st.tuples(st.just("tick"), st.integers(0, 200), st.integers(0, 200)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(step, max_size=30))
def test_no_action_twice_and_evictions_only_under_notice(script: list[tuple[object, ...]]) -> None:
    store = Store()
    store.set_pods([pod("w0"), pod("w1")])
    now = T0
    leads = {"a": 120, "b": 60, "c": 300}
    evicted: set[str] = set()
    told: dict[str, tuple[str, datetime] | None] = {"ns/w0": None, "ns/w1": None}
    for op, arg, advance in script:
        assert isinstance(advance, int)
        now += timedelta(seconds=advance)
        if op == "observe":
            assert isinstance(arg, frozenset)
            store.observe("aws", [notice(i, lead=leads[i] + 1000) for i in sorted(arg)], now)
        elif op == "ack":
            outcome = store.acknowledge(PodKey(f"ns/{arg}"), PodUid(f"uid-{arg}"), 1)
            if arg == "x":
                assert outcome is AckOutcome.NOT_ON_NODE
        for action in settle(store, now):
            if isinstance(action, EvictPod):
                # An eviction happens under the notice the pod was last told, once per pod.
                assert action.pod.key not in evicted
                assert told[action.pod.key] == (action.notice.event_id, action.notice.deadline)
                evicted.add(action.pod.key)
            elif isinstance(action, NotifyPod):
                # A pod is never told the same thing twice in a row, and never after eviction.
                assert action.pod.key not in evicted
                current = (action.notice.event_id, action.notice.deadline)
                assert told[action.pod.key] != current
                told[action.pod.key] = current
            elif isinstance(action, WithdrawPod):
                assert action.pod.key not in evicted
                assert told[action.pod.key] is not None
                told[action.pod.key] = None
        # Once everything due has been carried out, nothing is left due at the same instant.
        assert store.due(now) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.frozensets(ids), min_size=1, max_size=20))
def test_node_taint_matches_the_last_observation(observations: list[frozenset[str]]) -> None:
    store = Store()
    applied: tuple[str, ...] = ()
    for i, seen in enumerate(observations):
        store.observe("aws", [notice(x) for x in sorted(seen)], at(i))
        for action in run(store, at(i)):
            if isinstance(action, SyncNode):
                applied = tuple(t.notice.event_id for t in action.notices)
        assert set(applied) == set(seen)


def test_a_forged_ack_while_a_notice_is_live_evicts_nobody_early() -> None:
    store = Store()
    store.set_pods([pod("w0"), pod("w1")])
    store.observe("aws", [notice()], T0)
    run(store, T0)
    # Another pod's name with the caller's own uid, a made-up uid, a pod of another node.
    assert store.acknowledge(PodKey("ns/w0"), PodUid("uid-w1"), 7) is AckOutcome.NOT_ON_NODE
    assert store.acknowledge(PodKey("ns/w0"), PodUid("uid-forged"), 7) is AckOutcome.NOT_ON_NODE
    assert store.acknowledge(PodKey("ns/w5"), PodUid("uid-w5"), 7) is AckOutcome.NOT_ON_NODE
    assert not any(isinstance(a, EvictPod) for a in run(store, at(100)))
    assert {r["pod"]: r["acked_step"] for r in store.pod_report()} == {"ns/w0": None, "ns/w1": None}
    late = run(store, at(105))  # the margin, as if no ack had come
    assert [(a.pod.key, a.why) for a in late if isinstance(a, EvictPod)] == [
        ("ns/w0", "deadline"),
        ("ns/w1", "deadline"),
    ]


def test_an_ack_after_the_notice_was_withdrawn_is_refused() -> None:
    store = Store()
    store.set_pods([pod("w0")])
    store.observe("gcp", [notice("gcp-1", source="gcp", lead=300)], T0)
    run(store, T0)
    # Withdrawn, and the pod not yet told so (its withdrawal has not been carried out).
    store.observe("gcp", [], at(1))
    assert store.acknowledge(PodKey("ns/w0"), PodUid("uid-w0"), 3) is AckOutcome.NOT_UNDER_NOTICE
    assert run(store, at(1)) == [SyncNode(()), WithdrawPod(pod("w0"))]
    assert store.acknowledge(PodKey("ns/w0"), PodUid("uid-w0"), 3) is AckOutcome.NOT_UNDER_NOTICE


def test_a_pod_told_over_grpc_only_cannot_ack_once_the_notice_is_gone() -> None:
    """The workers heard the notice, its annotation failed, then the notice was withdrawn: a
    later ack must not stick and evict the pod the moment the next notice arrives."""
    store = Store()
    store.set_pods([pod("w0")])
    first = notice("gcp-1", source="gcp", lead=300)
    store.observe("gcp", [first], T0)
    for action in store.due(T0):
        if isinstance(action, NotifyPod):
            store.heard(action.pod.uid, action.notice)
        store.record(action, ok=not isinstance(action, NotifyPod), now=T0)
    assert store.acknowledge(PodKey("ns/w0"), PodUid("uid-w0"), 2) is AckOutcome.ACCEPTED
    store.observe("gcp", [], at(1))
    assert run(store, at(1)) == [SyncNode(())]
    assert store.acknowledge(PodKey("ns/w0"), PodUid("uid-w0"), 3) is AckOutcome.NOT_UNDER_NOTICE
    store.observe("gcp", [notice("gcp-2", source="gcp", lead=300)], at(10))
    # Told about the new notice, and not evicted for an ack that belonged to no notice.
    assert not any(isinstance(a, EvictPod) for a in settle(store, at(10)))
    assert not any(isinstance(a, EvictPod) for a in settle(store, at(200)))


def test_an_ack_before_the_pod_hears_of_its_notice_is_refused() -> None:
    store = Store()
    store.set_pods([pod("w0")])
    store.observe("aws", [notice()], T0)
    # Live, but nothing told to the pod yet: it cannot have checkpointed for it.
    assert store.acknowledge(PodKey("ns/w0"), PodUid("uid-w0"), 3) is AckOutcome.NOT_UNDER_NOTICE
    assert not any(isinstance(a, EvictPod) for a in settle(store, at(1)))


def test_workers_told_while_the_api_server_is_down_are_under_notice_once() -> None:
    """Nothing can be annotated: what the workers heard is what the pod was told. A watch
    opened later gets the notice, the same notice is not told twice, and the ack counts."""
    store = Store()
    store.set_pods([pod("w0")])
    live = notice()
    store.observe("aws", [live], T0)
    (tell,) = [a for a in store.due(T0) if isinstance(a, NotifyPod)]
    assert store.heard(tell.pod.uid, tell.notice) is True
    for action in store.due(T0):
        store.record(action, ok=False, now=T0)  # every write failed
    assert store.pod_notice(PodUid("uid-w0")) == live
    assert store.heard(tell.pod.uid, tell.notice) is False
    assert store.acknowledge(PodKey("ns/w0"), PodUid("uid-w0"), 4) is AckOutcome.ACCEPTED
    # Once the API server answers: annotated, then evicted for the ack.
    assert run(store, at(1)) == [SyncNode(store.node_wide()), NotifyPod(pod("w0"), live)]
    assert run(store, at(1)) == [EvictPod(pod("w0"), live, "acknowledged")]


def test_a_uid_listed_under_another_name_than_the_pod_file_gave_keeps_nothing() -> None:
    store = Store()
    store.set_pods([Pod(key=PodKey("ns/forged"), uid=PodUid("uid-w0"))])
    store.observe("aws", [notice()], T0)
    for action in store.due(T0):
        if isinstance(action, NotifyPod):
            store.heard(action.pod.uid, action.notice)
    assert store.acknowledge(PodKey("ns/forged"), PodUid("uid-w0"), 1) is AckOutcome.ACCEPTED
    store.set_pods([pod("w0")])  # the API server's list
    assert store.pod_notice(PodUid("uid-w0")) is None
    assert not any(isinstance(a, EvictPod) for a in settle(store, at(1)))


def test_a_restart_that_knew_the_pod_from_its_file_finds_the_annotation_in_the_list() -> None:
    """The pod file was written before the pod was annotated: the API server's list, which
    shows the annotation, says the pod was told, so it is not annotated (nor told) again."""
    live = notice()
    store = Store()
    store.set_pods([pod("w0")])  # from the file: no leave-by yet
    store.restore([Tracked(notice=live, first_seen=T0)])
    store.observe("aws", [live], T0)
    listed = Pod(key=PodKey("ns/w0"), uid=PodUid("uid-w0"), leave_by=live.deadline)
    store.set_pods([listed])
    assert not any(isinstance(a, NotifyPod) for a in store.due(at(1)))
    assert store.pod_notice(PodUid("uid-w0")) == live


# --- the scheduler's reclaim -------------------------------------------------------------------


def reclaimed(name: str, *, lead: float = 120, gang: str | None = "ml/big") -> Pod:
    """A worker pod as the scheduler leaves it when it reclaims it for ``gang``."""
    return Pod(
        key=PodKey(f"ns/{name}"),
        uid=PodUid(f"uid-{name}"),
        leave_by=at(lead),
        reclaimed_for=gang,
    )


def test_a_reclaim_is_a_notice_for_that_pod_only_due_at_its_leave_by() -> None:
    found = reclaim_notice(reclaimed("w0", lead=90))
    assert found is not None
    assert (found.source, found.kind, found.channel) == (
        "scheduler",
        Kind.RECLAIM,
        "scheduler/reclaim",
    )
    assert found.deadline == at(90)
    assert found.scope == frozenset({PodKey("ns/w0")})
    assert "ml/big" in found.reason
    # The agent's own leave-by (no reclaimed-for) and a daemon are not reclaims.
    assert reclaim_notice(reclaimed("w1", gang=None)) is None
    assert (
        reclaim_notice(
            Pod(PodKey("ns/d"), PodUid("d"), daemon=True, leave_by=at(1), reclaimed_for="g")
        )
        is None
    )
    # A new leave-by time is a new notice.
    later = reclaim_notice(reclaimed("w0", lead=200))
    assert later is not None
    assert later.event_id != found.event_id


def reclaim_store(*pods: Pod) -> Store:
    store = Store()
    store.set_pods(pods)
    store.observe("scheduler/reclaim", [n for p in pods if (n := reclaim_notice(p))], T0)
    return store


def test_a_reclaimed_worker_is_told_though_it_carries_the_leave_by_and_nothing_else_is() -> None:
    store = reclaim_store(reclaimed("w0"), pod("w1"))
    done = run(store, T0)
    # Told (the scheduler's annotation did not tell its watches); the node is left alone.
    assert [(type(a), getattr(a, "pod", None)) for a in done if not isinstance(a, SyncNode)] == [
        (NotifyPod, reclaimed("w0"))
    ]
    assert not any(isinstance(a, SyncNode) and a.notices for a in done)
    assert store.governing() is None


def test_a_reclaimed_worker_is_evicted_by_the_agent_only_once_it_acknowledged() -> None:
    store = reclaim_store(reclaimed("w0", lead=60), reclaimed("w1", lead=60))
    run(store, T0)
    # At the margins and past the deadline the scheduler evicts them, not the agent.
    for seconds in (46, 56, 61, 90):
        assert run(store, at(seconds)) == []
    assert store.acknowledge(PodKey("ns/w1"), PodUid("uid-w1"), 7) is AckOutcome.ACCEPTED
    evicted = run(store, at(91))
    assert [(type(a), getattr(a, "pod", None), getattr(a, "why", None)) for a in evicted] == [
        (EvictPod, reclaimed("w1", lead=60), "acknowledged")
    ]


def test_a_withdrawn_reclaim_is_withdrawn_from_the_pod_and_its_ack_forgotten() -> None:
    store = reclaim_store(reclaimed("w0"))
    run(store, T0)
    store.set_pods([pod("w0")])  # the scheduler took its annotations back
    store.observe("scheduler/reclaim", [], at(1))
    assert [type(a) for a in run(store, at(1))] == [WithdrawPod]
    assert store.acknowledge(PodKey("ns/w0"), PodUid("uid-w0"), 7) is AckOutcome.NOT_UNDER_NOTICE


def test_a_spot_notice_before_the_reclaim_governs_the_reclaimed_pod() -> None:
    store = reclaim_store(reclaimed("w0", lead=300))
    run(store, T0)
    store.observe("aws", [notice(lead=60)], at(1))
    told = [a for a in run(store, at(1)) if isinstance(a, NotifyPod)]
    assert [a.notice.event_id for a in told] == [EventId("aws-1")]
    # The spot deadline's margin evicts it as for any notice.
    assert [type(a) for a in run(store, at(46)) if not isinstance(a, SyncNode)] == [EvictPod]


# --- a notice shorter than the pod's checkpoint ------------------------------------------------


def test_a_notice_shorter_than_the_checkpoint_says_both_figures_and_what_is_lost() -> None:
    slow = Pod(key=PodKey("ns/slow"), uid=PodUid("uid-slow"), checkpoint_seconds=20)
    told = notice(lead=30)
    short = short_notice(slow, told, T0 + timedelta(seconds=25.4))
    assert short == ShortNotice(given=4, needed=20)
    assert short.message(told) == (
        "The notice gives 4 s (leave by 2026-11-30T10:00:30Z, aws terminate) but the checkpoint "
        "takes 20 s (shoal.dev/checkpoint-seconds): a checkpoint started now cannot complete "
        "in time, so the work since the pod's last complete checkpoint will be lost"
    )


def test_a_notice_long_enough_or_a_pod_that_declares_nothing_is_not_short() -> None:
    told = notice(lead=30)
    declares = Pod(key=PodKey("ns/p"), uid=PodUid("u"), checkpoint_seconds=30)
    assert short_notice(declares, told, T0) is None  # exactly enough
    assert short_notice(declares, told, T0 + timedelta(seconds=0.5)) == ShortNotice(29, 30)
    assert short_notice(pod("silent"), told, T0 + timedelta(seconds=29)) is None


def test_a_notice_past_its_deadline_gives_nothing() -> None:
    slow = Pod(key=PodKey("ns/slow"), uid=PodUid("uid-slow"), checkpoint_seconds=1.5)
    assert short_notice(slow, notice(lead=30), T0 + timedelta(seconds=40)) == ShortNotice(0, 1.5)
