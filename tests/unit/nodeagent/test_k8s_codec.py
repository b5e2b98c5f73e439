"""The ``shoal.dev/revocation`` annotation is what a restarted agent resumes from."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from contracts import names
from nodeagent.adapters.calls import WatchExpired
from nodeagent.adapters.k8s import (
    ApiError,
    ConditionRule,
    decode_revocation,
    encode_revocation,
    matching_condition,
)
from nodeagent.adapters.k8s.cluster import pod_change
from nodeagent.core.events import EventId, Kind, Notice, Tracked

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def tracked(event_id: str, minute: int, *, acked: bool = False) -> Tracked:
    notice = Notice(
        event_id=EventId(event_id),
        source="azure",
        channel="azure",
        kind=Kind.PREEMPT,
        deadline=T0.replace(minute=minute),
        reason="Azure scheduled event Preempt",
        upstream_id=event_id.removeprefix("azure-"),
    )
    return Tracked(notice=notice, first_seen=T0, upstream_acked=acked)


def test_round_trip_keeps_everything_a_restart_needs() -> None:
    live = [tracked("azure-A", 1, acked=True), tracked("azure-B", 5)]
    text = encode_revocation(live)
    doc = json.loads(text)
    # What people and the scheduler read: the most urgent notice at the top level.
    assert (doc["source"], doc["event_id"], doc["deadline"]) == (
        "azure",
        "azure-A",
        "2026-11-30T10:01:00Z",
    )
    assert decode_revocation(text) == live


@pytest.mark.parametrize(
    "text",
    [
        "{}",
        '{"notices": [{"event_id": "x"}]}',
        '{"notices": [{"event_id": "x", "source": "aws", "channel": "aws/spot", '
        '"kind": "explode", "deadline": "2026-11-30T10:00:00Z", "first_seen": "x"}]}',
        "[1, 2]",
    ],
)
def test_a_damaged_annotation_is_refused_with_the_field(text: str) -> None:
    with pytest.raises(ValueError, match="notices"):
        decode_revocation(text)


@pytest.mark.parametrize(
    ("rule", "condition", "matched"),
    [
        ("SandboxReady=False", {"type": "SandboxReady", "status": "False"}, True),
        ("SandboxReady=False", {"type": "SandboxReady", "status": "True"}, False),
        (
            "SandboxReady=False:Maintenance",
            {"type": "SandboxReady", "status": "False", "reason": "Maintenance"},
            True,
        ),
        (
            "SandboxReady=False:Maintenance",
            {"type": "SandboxReady", "status": "False", "reason": "ImagePull"},
            False,
        ),
    ],
)
def test_pod_condition_rules(rule: str, condition: dict[str, str], matched: bool) -> None:
    found = matching_condition(condition, frozenset({ConditionRule.parse(rule)}))
    assert (found is not None) is matched


@pytest.mark.parametrize("text", ["SandboxReady", "=False", "Ready="])
def test_bad_condition_rules_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="Type=Status"):
        ConditionRule.parse(text)


@pytest.mark.parametrize(
    "text",
    [
        # Someone edited the annotation: a deadline at the very start of the calendar.
        json.dumps(
            {
                "notices": [
                    {
                        **json.loads(encode_revocation([tracked("azure-A", 1)]))["notices"][0],
                        "deadline": "0001-01-01T00:00:00+01:00",
                    }
                ]
            }
        ),
        "[" * 100_000,
    ],
    ids=["year-one", "nested"],
)
def test_a_damaged_annotation_is_a_value_error_not_a_crash(text: str) -> None:
    # Anything else made the restore step fail and retry for ever: the agent never got ready.
    with pytest.raises(ValueError, match=r"notices|JSON"):
        decode_revocation(text)


def watched(kind: str, *, phase: str = "Running", **annotations: str) -> dict[str, object]:
    return {
        "type": kind,
        "object": {
            "metadata": {
                "namespace": "ml",
                "name": "w-1",
                "uid": "u-1",
                "resourceVersion": "77",
                "labels": {names.GANG_LABEL: "small"},
                "annotations": annotations,
            },
            "status": {"phase": phase},
        },
    }


def test_a_watched_pod_reads_as_the_store_needs_it() -> None:
    change = pod_change(
        watched(
            "MODIFIED",
            **{
                names.LEAVE_BY_ANNOTATION: "2026-11-30T10:02:00Z",
                names.RECLAIMED_FOR_ANNOTATION: "ml/big",
            },
        )
    )
    assert change is not None
    assert change.version == "77"
    assert not change.gone
    assert change.item is not None
    assert (change.item.key, change.item.reclaimed_for) == ("ml/w-1", "ml/big")
    assert change.item.leave_by == T0.replace(minute=2)
    # Deleted, or finished (a list leaves those out): gone.
    for gone in (watched("DELETED"), watched("MODIFIED", phase="Succeeded")):
        assert getattr(pod_change(gone), "gone", None) is True
    bookmark = pod_change(watched("BOOKMARK"))
    assert bookmark is not None
    assert (bookmark.item, bookmark.version) == (None, "77")


def test_a_watch_error_event_is_raised_410_as_too_old() -> None:
    with pytest.raises(WatchExpired):
        pod_change({"type": "ERROR", "object": {"code": 410, "message": "too old"}})
    with pytest.raises(ApiError, match="forbidden"):
        pod_change({"type": "ERROR", "object": {"code": 403, "message": "forbidden"}})
