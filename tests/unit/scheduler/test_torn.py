"""Torn gangs with plain values: what is counted, when a gang is told and released."""

from __future__ import annotations

import re
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from scheduler.model import Gang, GangKey, NodeName
from scheduler.torn import (
    Shortfall,
    TornLedger,
    below_minimum_message,
    is_torn,
    released_message,
    survivors,
)
from tests.unit.scheduler.builders import pod

NEGATIVE = re.compile(r"(?<!\d)-\d")


def _gang(*, bound: int, pending: int, minimum: int, deleting: int = 0) -> Gang:
    members = [pod(f"b{i}", gang="g", node=f"n{i}", created=i) for i in range(bound + deleting)]
    members[bound:] = [replace(p, deleting=True) for p in members[bound:]]
    members += [pod(f"p{i}", gang="g", created=100 + i) for i in range(pending)]
    return Gang(
        key=GangKey("ns/g"),
        namespace="ns",
        name="g",
        min_member=minimum,
        max_member=max(minimum, len(members)),
        members=tuple(members),
    )


def test_pending_members_without_room_are_told_apart_from_members_to_be_created() -> None:
    assert Shortfall(2, 3, 2).text() == "2 of 3 bound; 2 members pending, no room for them"
    assert Shortfall(2, 3, 1).text() == "2 of 3 bound; 1 member pending, no room for it"
    assert Shortfall(5, 8, 0).text() == (
        "5 of 8 bound, 0 pending; waiting for 3 more member(s) to be created"
    )
    assert Shortfall(5, 8, 1).text() == (
        "5 of 8 bound; 1 member pending, waiting for 2 more member(s) to be created"
    )


@given(bound=st.integers(0, 50), minimum=st.integers(1, 50), pending=st.integers(0, 50))
def test_no_count_is_ever_negative(bound: int, minimum: int, pending: int) -> None:
    shortfall = Shortfall(bound, minimum, pending)
    assert shortfall.missing >= 0
    assert shortfall.to_create >= 0
    assert not NEGATIVE.search(below_minimum_message("g", shortfall, 1.8e9))
    assert not NEGATIVE.search(released_message("g", shortfall, 1.8e9, 1.8e9 + 30))


def test_members_being_deleted_are_not_survivors() -> None:
    gang = _gang(bound=5, pending=0, minimum=8, deleting=3)
    assert [p.name for p in survivors(gang)] == [f"b{i}" for i in range(5)]
    assert is_torn(gang)  # its deleted members still hold a node, but not for long
    assert Shortfall.of(gang) == Shortfall(5, 8, 0)
    assert not is_torn(_gang(bound=0, pending=0, minimum=8, deleting=8))  # deleted whole


def test_the_release_message_says_when_and_how_members_are_asked_to_leave() -> None:
    text = released_message("g", Shortfall(2, 3, 2), 1_800_000_000.0, 1_800_000_090.0)
    assert "2 members pending, no room for them" in text
    assert "asked to leave by 2027-01-15T08:01:30Z" in text
    assert "shoal.dev/leave-by" in text
    assert "no member to complete it" not in text


def test_a_gang_lacking_members_is_told_at_once_and_released_once_after_the_grace() -> None:
    ledger = TornLedger(grace=60.0)
    gang = _gang(bound=5, pending=0, minimum=8)
    update = ledger.update([gang], 0.0)
    assert [(t.gang.key, t.release_at, t.first) for t in update.told] == [("ns/g", 60.0, True)]
    assert ledger.next_due() == 60.0
    assert ledger.update([gang], 30.0).told == ()  # nothing new to say
    due = ledger.update([gang], 60.0).due
    assert [(t.since, [p.name for p in t.survivors]) for t in due] == [
        (0.0, [f"b{i}" for i in range(5)])
    ]
    assert ledger.update([gang], 120.0) == ledger.update([gang], 500.0)  # released once
    assert ledger.next_due() is None


def test_a_gang_whose_members_exist_is_told_only_once_a_decision_found_no_room() -> None:
    ledger = TornLedger(grace=60.0)
    gang = _gang(bound=2, pending=2, minimum=3)
    assert ledger.update([gang], 0.0).told == ()  # a scale-up the cycle may place at once
    assert ledger.next_due() is None
    told = ledger.stuck(gang, 1.0)
    assert told is not None
    assert (told.release_at, told.first) == (61.0, True)
    assert ledger.stuck(gang, 2.0) is None  # the same thing, said already
    assert ledger.update([gang], 3.0).told == ()
    assert [t.gang.key for t in ledger.update([gang], 61.0).due] == ["ns/g"]


def test_a_gang_placed_in_time_is_forgotten_and_never_told() -> None:
    ledger = TornLedger(grace=60.0)
    gang = _gang(bound=2, pending=2, minimum=3)
    ledger.update([gang], 0.0)
    placed = replace(
        gang, members=tuple(replace(p, node=p.node or NodeName("n9")) for p in gang.members)
    )
    assert ledger.update([placed], 1.0) == ledger.update([placed], 100.0)
    assert ledger.stuck(placed, 2.0) is None
    assert ledger.since(gang.key) is None


def test_the_explanation_follows_the_survivors() -> None:
    ledger = TornLedger(grace=600.0)
    gang = _gang(bound=7, pending=0, minimum=8)
    assert len(ledger.update([gang], 0.0).told) == 1
    fewer = replace(gang, members=gang.members[2:])  # the members told first went
    again = ledger.update([fewer], 1.0).told
    assert [([p.name for p in t.survivors], t.first, t.release_at) for t in again] == [
        ([f"b{i}" for i in range(2, 7)], False, 600.0)
    ]
    deleting = replace(
        fewer, members=(replace(fewer.members[0], deleting=True), *fewer.members[1:])
    )
    assert [len(t.survivors) for t in ledger.update([deleting], 2.0).told] == [4]


def test_a_finishing_gang_is_not_torn() -> None:
    gang = replace(_gang(bound=2, pending=0, minimum=3), succeeded=1)
    assert not is_torn(gang)
    assert TornLedger(grace=1.0).update([gang], 0.0).told == ()
