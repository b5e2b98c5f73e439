"""Gang sizes and membership from PodGroups and from labels; wrong input becomes a message."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from contracts import names
from scheduler.cache import Cache
from scheduler.gang import CountError, GangBuilder, build_gangs, parse_count
from scheduler.model import Assignment, Gang, GangKey, InvalidGang, NodeName, PodKey, PodPhase
from tests.unit.scheduler.builders import SCHED, group, node, pod


@given(st.integers(min_value=1, max_value=1_000_000))
def test_any_positive_count_round_trips_as_int_and_text(value: int) -> None:
    assert parse_count(value, "f") == value
    assert parse_count(f" {value} ", "f") == value


@given(st.one_of(st.text(), st.integers(), st.floats(), st.none(), st.booleans()))
def test_parse_count_never_raises_and_is_a_positive_int_or_an_error(raw: object) -> None:
    result = parse_count(raw, "spec.minMember")
    if isinstance(result, CountError):
        assert "spec.minMember" in result.message
    else:
        assert isinstance(result, int)
        assert result >= 1


def test_signs_that_int_refuses_are_an_error_not_an_exception() -> None:
    # "+-1" once passed a check that stripped every sign, then made int() raise inside the
    # scheduling cycle: one such pod stopped every gang in the cluster.
    for raw in ("+-1", "--1", "-+1", "++1", "+", "-", "1_000", "\u0661", "1e3", " + 1"):
        result = parse_count(raw, "min")
        assert isinstance(result, CountError), raw
        assert "min" in result.message
    assert parse_count("+3", "min") == 3
    assert parse_count("-3", "min") == CountError("min: must be at least 1, got -3")


def test_bad_counts_say_what_is_wrong() -> None:
    assert parse_count("two", "min") == CountError("min: must be a whole number >= 1, got 'two'")
    assert parse_count("0", "min") == CountError("min: must be at least 1, got 0")
    assert parse_count(-3, "min") == CountError("min: must be at least 1, got -3")
    assert isinstance(parse_count("4.0", "min"), CountError)
    assert isinstance(parse_count(True, "min"), CountError)


def test_pod_group_gang_takes_min_from_spec_and_max_from_annotation() -> None:
    pods = [pod(f"w{i}", pod_group="train", created=i) for i in range(5)]
    groups = {"ns/train": group("train", 2, **{names.MAX_MEMBER_ANNOTATION: "4"})}
    gangs, invalid = build_gangs(pods, groups, SCHED)
    assert invalid == []
    [gang] = gangs
    assert (gang.min_member, gang.max_member, gang.pod_group) == (2, 4, "ns/train")
    assert [p.name for p in gang.members] == ["w0", "w1", "w2", "w3", "w4"]


def test_pod_group_without_max_allows_every_member_pod() -> None:
    pods = [pod(f"w{i}", pod_group="train") for i in range(3)]
    gangs, _ = build_gangs(pods, {"ns/train": group("train", 2)}, SCHED)
    assert gangs[0].max_member == 3


def test_label_gang_reads_annotations_and_defaults_min_to_every_member() -> None:
    elastic = [pod(f"e{i}", gang="el", min_member="2", max_member="4") for i in range(3)]
    rigid = [pod(f"r{i}", gang="rigid") for i in range(3)]
    gangs, invalid = build_gangs([*elastic, *rigid], {}, SCHED)
    assert invalid == []
    sizes = {g.name: (g.min_member, g.max_member) for g in gangs}
    assert sizes == {"el": (2, 4), "rigid": (3, 3)}


def test_pod_without_gang_is_a_gang_of_one() -> None:
    gangs, _ = build_gangs([pod("alone", priority=7)], {}, SCHED)
    [gang] = gangs
    assert (gang.min_member, gang.max_member, gang.priority) == (1, 1, 7)


def test_a_pod_group_label_wins_over_a_gang_label_on_the_same_pod() -> None:
    both = [pod(f"w{i}", pod_group="train", gang="other", min_member="9") for i in range(3)]
    gangs, invalid = build_gangs(both, {"ns/train": group("train", 2)}, SCHED)
    assert invalid == []
    [gang] = gangs
    assert (gang.key, gang.min_member, gang.pod_group) == ("ns/train", 2, "ns/train")


def test_an_empty_gang_label_names_no_gang() -> None:
    # Its key was already the pod's own; its sizes now are a gang of one's too.
    alone = pod("alone", gang="", min_member="4", max_member="x")
    gangs, invalid = build_gangs([alone], {}, SCHED)
    assert invalid == []
    [gang] = gangs
    assert (gang.key, gang.min_member, gang.max_member) == ("ns/pod:alone", 1, 1)


def test_finished_pods_do_not_count_toward_the_minimum() -> None:
    done = replace(pod("w0", gang="g", min_member="2", node="n1"), phase=PodPhase.SUCCEEDED)
    live = pod("w1", gang="g", min_member="2", node="n1")
    gangs, _ = build_gangs([done, live], {}, SCHED)
    assert [p.name for p in gangs[0].members] == ["w1"]
    assert gangs[0].min_missing == 1


def test_other_schedulers_pods_alone_are_not_our_gangs() -> None:
    gangs, invalid = build_gangs([pod("x", scheduler="default-scheduler")], {}, SCHED)
    assert (gangs, invalid) == ([], [])


def _invalid(pods: list[object], groups: dict[str, object] | None = None) -> InvalidGang:
    gangs, invalid = build_gangs(pods, groups or {}, SCHED)  # type: ignore[arg-type]
    assert gangs == []
    [bad] = invalid
    return bad


def test_min_greater_than_max_is_reported() -> None:
    bad = _invalid([pod("a", gang="g", min_member="4", max_member="2")])
    assert "(2) is smaller than the minimum (4)" in bad.message


def test_non_numeric_and_zero_minimum_are_reported() -> None:
    assert "got 'lots'" in _invalid([pod("a", gang="g", min_member="lots")]).message
    bad = _invalid([pod("a", pod_group="pg")], {"ns/pg": group("pg", 0)})
    assert bad.message == "PodGroup ns/pg spec.minMember: must be at least 1, got 0"


def test_missing_pod_group_is_reported_and_waits() -> None:
    bad = _invalid([pod("a", pod_group="later")])
    assert "PodGroup ns/later" in bad.message
    assert "does not exist yet" in bad.message
    assert bad.reason == "PodGroupNotFound"


def test_members_with_different_scheduler_names_are_reported() -> None:
    bad = _invalid([pod("a", gang="g"), pod("b", gang="g", scheduler="default-scheduler")])
    assert "different schedulerNames" in bad.message
    assert "default-scheduler" in bad.message


def test_members_disagreeing_while_their_bounds_are_patched_keep_the_widest_bounds() -> None:
    # A stage change patches the members one at a time: no error while they disagree; the gang
    # keeps the lowest minimum and the highest maximum (nothing asked to leave meanwhile).
    pods = [
        pod("a", gang="g", min_member="2", max_member="4"),
        pod("b", gang="g", min_member="3", max_member="2"),
        pod("c", gang="g", min_member="3", max_member="2"),
    ]
    gangs, invalid = build_gangs(pods, {}, SCHED)
    assert invalid == []
    assert [(g.min_member, g.max_member) for g in gangs] == [(2, 4)]


def test_a_member_with_a_bound_that_is_not_a_count_is_still_reported() -> None:
    bad = _invalid([pod("a", gang="g", min_member="2"), pod("b", gang="g", min_member="x")])
    assert "min-member" in bad.message


@given(
    min_raw=st.one_of(st.none(), st.text(max_size=4), st.integers(-3, 9).map(str)),
    max_raw=st.one_of(st.none(), st.text(max_size=4), st.integers(-3, 9).map(str)),
    count=st.integers(1, 6),
)
def test_every_label_gang_is_valid_with_min_le_max_or_invalid_with_a_message(
    min_raw: str | None, max_raw: str | None, count: int
) -> None:
    pods = [pod(f"p{i}", gang="g", min_member=min_raw, max_member=max_raw) for i in range(count)]
    gangs, invalid = build_gangs(pods, {}, SCHED)
    assert len(gangs) + len(invalid) == 1
    for gang in gangs:
        assert isinstance(gang, Gang)
        assert 1 <= gang.min_member <= gang.max_member
    for bad in invalid:
        assert bad.message


def test_the_cache_groups_members_so_unchanged_gangs_are_not_rebuilt() -> None:
    cache = Cache()
    cache.set_node(node("n0"))
    for g in ("a", "b"):
        for i in range(2):
            cache.set_pod(pod(f"{g}{i}", gang=g, min_member="2"))
    builder = GangBuilder(SCHED)
    first = cache.snapshot()
    assert first.members is not None
    assert sorted(first.members) == ["ns/a", "ns/b"]
    gangs, _ = builder.build(first.pods.values(), first.pod_groups, first.members)
    before = {g.key: g for g in gangs}

    cache.assume([Assignment(PodKey("ns/a0"), NodeName("n0"))], now=0.0)
    second = cache.snapshot()
    assert second.members is not None
    a, b = GangKey("ns/a"), GangKey("ns/b")
    assert second.members[b] is first.members[b]
    gangs, _ = builder.build(second.pods.values(), second.pod_groups, second.members)
    after = {g.key: g for g in gangs}
    assert after[b] is before[b]  # untouched: reused as is
    assert [p.name for p in after[a].bound] == ["a0"]  # the assumed member shows bound
    # The grouped path and a pass over every pod agree.
    plain, _ = GangBuilder(SCHED).build(second.pods.values(), second.pod_groups)
    assert {g.key: (g.min_member, len(g.bound)) for g in plain} == {
        g.key: (g.min_member, len(g.bound)) for g in after.values()
    }

    cache.remove_pod(PodKey("ns/b0"))
    cache.remove_pod(PodKey("ns/b1"))
    third = cache.snapshot()
    assert third.members is not None
    assert "ns/b" not in third.members
