"""The reclaim ledger on plain values and a virtual clock, and the proof that the live loop and
the simulator keep their reclaim books with it: same victims, same eviction time, same end of
a hold."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from contracts import names
from scheduler.cache import Cache
from scheduler.model import Gang, GangKey, NodeName, PodKey, PodPhase, PodRequest, Resources
from scheduler.reclaim_ledger import ReclaimLedger, parse_leave_by
from scheduler.simulate import engine, inputs
from tests.unit.scheduler.builders import node, pod
from tests.unit.scheduler.test_runner import Clock, Recorder, runner

W = GangKey("ns/w")
ROOM = ((NodeName("n1"), Resources(8000, 2**30, 8, 1)),)


def gang(key: GangKey, minimum: int, members: list[PodRequest]) -> Gang:
    return Gang(key, "ns", key.split("/")[1], minimum, max(minimum, len(members)), tuple(members))


def victim(name: str, **fields: object) -> PodRequest:
    return replace(pod(name, gpus=8, node="n1"), **fields)  # type: ignore[arg-type]


def pods_of(*pods: PodRequest) -> dict[PodKey, PodRequest]:
    return {p.key: p for p in pods}


def waiting() -> Gang:
    return gang(W, 1, [pod("w0", gpus=8)])


def ledger() -> ReclaimLedger:
    return ReclaimLedger(grace=30.0, hold_extra=120.0)


# -- victims ------------------------------------------------------------------------------------


def test_victims_are_evicted_once_when_their_grace_ends() -> None:
    book = ledger()
    e1 = victim("e1")
    assert book.chosen(W, [e1.key], ROOM, now=100.0) == 130.0
    assert book.leaving() == {W: 1}
    assert book.next_due() == 130.0
    assert book.due(pods_of(e1), now=129.9) == ()
    assert book.due(pods_of(e1), now=130.0) == (e1.key,)
    assert book.due(pods_of(e1), now=131.0) == ()  # in flight: not evicted twice at once


def test_a_failed_eviction_is_tried_again_after_the_retry() -> None:
    book = ledger()
    e1 = victim("e1")
    book.chosen(W, [e1.key], ROOM, now=100.0)
    assert book.due(pods_of(e1), now=130.0) == (e1.key,)
    book.eviction_failed(e1.key, now=131.0)
    assert book.next_due() == 136.0
    assert book.due(pods_of(e1), now=135.9) == ()
    assert book.due(pods_of(e1), now=136.0) == (e1.key,)


def test_victims_that_left_stop_counting_and_pods_being_deleted_are_not_evicted() -> None:
    book = ledger()
    gone, unbound, done, deleting = (victim(n) for n in ("a", "b", "c", "d"))
    book.chosen(W, [p.key for p in (gone, unbound, done, deleting)], ROOM, now=0.0)
    pods = pods_of(
        replace(unbound, node=None),
        replace(done, phase=PodPhase.SUCCEEDED),
        replace(deleting, deleting=True),
    )
    update = book.update([waiting()], pods, now=10.0)
    assert update.leaving == {W: 1}  # only the one being deleted is still there
    assert book.due(pods, now=30.0) == ()


def test_a_victim_chosen_again_is_spent_its_gang_and_leave_by_never_move() -> None:
    # Two gangs that chose the same victim once asked it in turn, each for itself, and pushed
    # its leave-by 30 s later on every cycle: it was never evicted and neither gang bound.
    book = ledger()
    e1 = victim("e1")
    other = GangKey("ns/x")
    assert book.ask(W, [e1.key], ROOM, now=0.0) == ((e1.key,), 30.0)
    for now in (1.0, 20.0, 29.0):
        assert book.ask(other, [e1.key], ROOM, now=now) == ((), now + 30.0)
        assert book.ask(W, [e1.key], ROOM, now=now) == ((), now + 30.0)
    assert book.spent() == {e1.key: W}
    assert book.leaving() == {W: 1}
    assert book.due(pods_of(e1), now=29.9) == ()
    assert book.due(pods_of(e1), now=30.0) == (e1.key,)  # at its first leave-by


def test_chosen_asks_only_the_victims_not_already_leaving() -> None:
    book = ledger()
    e1, e2 = victim("e1"), victim("e2")
    other = GangKey("ns/x")
    assert book.chosen(W, [e1.key], ROOM, now=0.0) == 30.0
    assert book.ask(other, [e1.key, e2.key], ROOM, now=5.0) == ((e2.key,), 35.0)
    assert book.spent() == {e1.key: W, e2.key: other}
    assert book.leaving() == {W: 1, other: 1}
    assert book.reserved() == {W: ROOM, other: ROOM}
    assert book.due(pods_of(e1, e2), now=30.0) == (e1.key,)
    assert book.due(pods_of(e1, e2), now=35.0) == (e2.key,)
    book.update([waiting()], pods_of(e2), now=36.0)  # e1 has gone: it may be asked again
    assert book.spent() == {e2.key: other}


@given(st.lists(st.tuples(st.sampled_from(["w", "x", "y"]), st.floats(0, 1000)), max_size=20))
def test_a_victims_leave_by_is_set_once_and_never_moves(asks: list[tuple[str, float]]) -> None:
    book = ledger()
    e1 = victim("e1")
    first: tuple[GangKey, float] | None = None
    for name, now in sorted(asks, key=lambda ask: ask[1]):
        asked, leave_by = book.ask(GangKey(f"ns/{name}"), [e1.key], ROOM, now)
        if first is None:
            assert asked == (e1.key,)
            first = (GangKey(f"ns/{name}"), leave_by)
        else:
            assert asked == ()
        assert book.spent() == {e1.key: first[0]}
        assert book.next_due() == first[1]  # the eviction, at the first leave-by


def test_a_pod_evicted_for_another_reason_is_not_evicted_again_meanwhile() -> None:
    book = ledger()
    e1 = victim("e1")
    book.chosen(W, [e1.key], ROOM, now=0.0)
    assert book.start_eviction(e1.key)  # a torn gang's release got there first
    assert not book.start_eviction(e1.key)
    assert book.due(pods_of(e1), now=30.0) == ()
    book.evicted(e1.key)
    assert book.due(pods_of(e1), now=30.0) == ()  # it is going anyway
    assert book.leaving() == {W: 1}


def test_an_evicted_victim_counts_as_leaving_until_it_is_gone_but_is_never_due_again() -> None:
    book = ledger()
    e1, e2 = victim("e1"), victim("e2")
    book.chosen(W, [e1.key], ROOM, now=0.0)
    book.chosen(GangKey("ns/x"), [e2.key], ROOM, now=10.0)
    assert book.due(pods_of(e1, e2), now=30.0) == (e1.key,)
    assert book.next_due() == 40.0  # e1 is in flight: its outcome, not the clock, comes next
    book.evicted(e1.key)
    assert book.next_due() == 40.0
    assert book.due(pods_of(e1, e2), now=35.0) == ()
    assert book.leaving() == {W: 1, GangKey("ns/x"): 1}
    book.update([waiting()], pods_of(e2), now=36.0)  # e1 has gone
    assert book.leaving() == {GangKey("ns/x"): 1}


# -- victims a previous scheduler chose ----------------------------------------------------------


def annotated(leave_by: str) -> PodRequest:
    notes = {names.RECLAIMED_FOR_ANNOTATION: W, names.LEAVE_BY_ANNOTATION: leave_by}
    return pod("e1", gpus=8, gang="e", node="n1", annotations=notes)


def test_victims_chosen_by_a_previous_scheduler_are_picked_up_from_their_annotations() -> None:
    book = ledger()
    e1 = annotated("1970-01-01T00:02:10Z")
    update = book.update([waiting(), gang(GangKey("ns/e"), 1, [e1])], pods_of(e1), now=100.0)
    assert update.leaving == {W: 1}
    assert book.due(pods_of(e1), now=129.0) == ()
    assert book.due(pods_of(e1), now=130.0) == (e1.key,)


def test_an_unreadable_leave_by_means_now() -> None:
    book = ledger()
    e1 = annotated("tomorrow")
    book.update([waiting(), gang(GangKey("ns/e"), 1, [e1])], pods_of(e1), now=100.0)
    assert book.due(pods_of(e1), now=100.0) == (e1.key,)


@given(st.text())
def test_reading_a_leave_by_never_raises(text: str) -> None:
    assert isinstance(parse_leave_by(text, 7.0), float)


def test_leave_by_reads_rfc3339_and_refuses_times_without_a_zone() -> None:
    assert parse_leave_by("1970-01-01T00:01:00Z", 0.0) == 60.0
    assert parse_leave_by("1970-01-01T01:01:00+01:00", 0.0) == 60.0
    assert parse_leave_by("1970-01-01T00:01:00", 5.0) == 5.0
    assert parse_leave_by("9999-12-31T23:59:59-23:59", 5.0) > 0
    assert parse_leave_by("", 5.0) == parse_leave_by(None, 5.0) == 5.0


# -- holds ---------------------------------------------------------------------------------------


def test_room_is_held_until_grace_plus_extra_then_given_back() -> None:
    book = ledger()
    book.chosen(W, [], ROOM, now=0.0)
    assert book.reserved() == {W: ROOM}
    assert book.update([waiting()], {}, now=149.9).expired == ()
    assert book.next_due() == 150.0
    assert book.update([waiting()], {}, now=150.0).expired == (W,)
    assert book.reserved() == {}
    assert book.next_due() is None


def test_a_hold_ends_when_its_gang_is_gone_has_its_minimum_or_is_placed() -> None:
    book = ledger()
    met = gang(GangKey("ns/met"), 1, [pod("m0", gpus=8, node="n0")])
    short = gang(GangKey("ns/short"), 1, [pod("s0", gpus=8)])
    for key in (W, met.key, short.key):
        book.chosen(key, [], ROOM, now=0.0)
    assert set(book.update([met, short], {}, now=1.0).expired) == {W, met.key}
    assert book.reserved() == {short.key: ROOM}
    book.placed(short.key)
    assert book.reserved() == {}


# -- the live loop and the simulator keep the same books -----------------------------------------

J1 = inputs.JobSpec("job-1", 0.0, 36000.0, pod_gpus=8, min_pods=1, max_pods=2)
J2 = inputs.JobSpec("job-2", 10.0, 600.0, pod_gpus=8, min_pods=1, max_pods=1)
NODES = [node("n0"), node("n1", spot=True)]
#: Node n1 is a spot instance from 0; in the revocation case it is noticed at 30 and goes at 60.
SPOT = [inputs.SpotEvent(0.0, "add", "i-1")]
REVOKED = [*SPOT, inputs.SpotEvent(60.0, "remove", "i-1")]


def simulated(until: float, spot: list[inputs.SpotEvent]) -> engine.Simulation:
    settings = engine.Settings(horizon=until, notice_seconds=30.0, restart_seconds=0.0)
    sim = engine.Simulation(NODES, [J1, J2], spot, "shoal", settings)
    sim.run()
    return sim


def bound(cache: Cache) -> dict[str, str]:
    return {p.name: p.node for p in cache.snapshot().pods.values() if p.node is not None}


def live(sim_at_start: engine.Simulation) -> tuple[Cache, Recorder, Clock]:
    """The live loop's cache as the simulator left it at 5 s: j1 on both nodes, j2 arrived."""
    cache = Cache()
    for n in NODES:
        cache.set_node(n)
    for name, where in bound(sim_at_start.cache).items():
        cache.set_pod(
            pod(
                name,
                namespace="sim",
                gpus=8,
                gang="job-1",
                min_member="1",
                max_member="2",
                node=where,
            )
        )
    cache.set_pod(
        pod("job-2-0", namespace="sim", gpus=8, gang="job-2", min_member="1", created=10.0)
    )
    return cache, Recorder(), Clock(now=10.0)


def test_the_live_loop_and_the_simulator_choose_and_evict_the_same_victim_at_the_same_time() -> (
    None
):
    start = simulated(5.0, SPOT)
    cache, recorder, clock = live(start)
    loop = runner(cache, recorder, clock, reclaim_grace=30.0, hold_extra=120.0)
    decision, _ = loop.run_once()
    assert decision is not None
    (victim_key,) = decision.victims
    victim_name = victim_key.split("/")[1]
    assert recorder.asked == [(victim_name, 40.0, "sim/job-2")]
    clock.now = 39.9
    loop.run_once()
    assert recorder.evicted == []
    clock.now = 40.0
    loop.run_once()
    assert recorder.evicted == [victim_name]

    # The simulator: the same member still runs just before 40, and is gone at 40, with j2 in
    # its place.
    where = bound(start.cache)[victim_name]
    assert victim_name in bound(simulated(39.9, SPOT).cache)
    at_40 = bound(simulated(40.0, SPOT).cache)
    assert victim_name not in at_40
    assert at_40["job-2-0"] == where


def test_the_live_loop_and_the_simulator_give_a_hold_back_at_the_same_moment() -> None:
    # The victim's node is revoked before its grace ends: the victim is gone, j2 still cannot
    # fit, and the room held for it ends at 10 + 30 + 120 = 160 in both.
    start = simulated(5.0, REVOKED)
    cache, recorder, clock = live(start)
    loop = runner(cache, recorder, clock, reclaim_grace=30.0, hold_extra=120.0)
    loop.run_once()
    clock.now = 30.0  # the notice: cordoned, its workers leave
    cache.set_node(replace(NODES[1], unschedulable=True))
    for name, where in bound(start.cache).items():
        if where == "n1":
            cache.remove_pod(PodKey(f"sim/{name}"))
    loop.run_once()
    clock.now = 60.0
    cache.remove_node(NodeName("n1"))
    loop.run_once()
    held = {GangKey("sim/job-2"): [NodeName("n1")]}

    def nodes_held(book: ReclaimLedger) -> dict[GangKey, list[NodeName]]:
        return {k: [n for n, _ in room] for k, room in book.reserved().items()}

    for moment, expected in ((159.9, held), (160.0, {})):
        clock.now = moment
        loop.run_once()
        assert nodes_held(loop.reclaims) == expected, moment
        assert nodes_held(simulated(moment, REVOKED).reclaims) == expected, moment
    assert recorder.evicted == []  # the victim left with its node before its eviction was due
