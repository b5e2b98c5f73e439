"""The web view after a stage change: each gang's bounds and what it waits for, in the very
words ``kubectl shoal why`` prints for the same cluster, and the history of its bound changes."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from contracts import names
from scheduler.gang.build import build_gangs
from scheduler.k8s import convert
from scheduler.model import Gang
from scheduler.torn import Shortfall, below_minimum_message
from scheduler.web import server
from scheduler.web.feed import BOUNDS_EVERY, Feed, Tee
from shoalctl import views
from tests.unit.scheduler.builders import node, snapshot
from tests.unit.shoalctl.test_views_and_render import NOW, SCHED, cluster, event, pod

#: 10:02:03 UTC.
AT = datetime(2027, 1, 15, 10, 2, 3, tzinfo=UTC).timestamp()


class _Inner:
    """The API reporter, which the web view's tee passes every call on to."""

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def _web(raw: list[dict[str, Any]], clock: float = NOW) -> tuple[Feed, list[Gang], Any]:
    """The feed, the gangs and the snapshot the scheduler's loop has for the ``raw`` pods."""
    snap = snapshot([node("n1", gpus=8), node("n2", gpus=8)], [convert.pod(p) for p in raw])
    gangs, invalid = build_gangs(snap.pods.values(), snap.pod_groups, SCHED)
    feed = Feed(SCHED, clock=lambda: clock)
    feed.observe(snap, gangs, invalid, clock)
    return feed, gangs, snap


def _row(feed: Feed, key: str) -> dict[str, Any]:
    doc = feed.document()
    assert doc is not None
    found: dict[str, Any] = next(g for g in doc["gangs"] if g["key"] == key)
    return found


def test_a_raised_minimum_shows_its_bounds_and_what_it_waits_for_as_kubectl_shoal_why() -> None:
    waits = (
        "Gang st runs with 2 member(s) bound, below its raised minimum 4; they keep running "
        "while it waits for room for 2 more: 0/2 nodes are available: 2 Insufficient "
        "nvidia.com/gpu."
    )
    raw = [
        pod("st-0", gang="st", node="n1", min_member=4),
        pod("st-1", gang="st", node="n1", min_member=4),
        pod("st-2", gang="st", min_member=4),
        pod("st-3", gang="st", min_member=4),
    ]
    feed, gangs, _ = _web(raw)
    (gang,) = gangs
    # What the loop tells its reporter; the API reporter writes it as a WaitingForRoom Event.
    Tee(_Inner(), feed).unschedulable(gang, gang.pending, waits)
    row = _row(feed, "ml/st")
    printed = views.why(
        cluster(raw, [event("st-2", "WaitingForRoom", waits, "2027-01-15T08:01:00Z")]),
        SCHED,
        "ml",
        "st",
        NOW,
    )
    assert printed is not None
    assert row["why"] == printed["decision"]
    assert row["why"] == f"Running below its raised minimum: 2 of min 4 (max 4) bound. {waits}"
    assert (row["reasonCode"], row["min"], row["max"], row["bound"]) == ("WaitingForRoom", 4, 4, 2)


def test_a_lowered_maximum_says_which_members_leave_as_kubectl_shoal_why() -> None:
    bounds = {names.MAX_MEMBER_ANNOTATION: "2"}
    leave = {
        **bounds,
        names.LEAVE_BY_ANNOTATION: "2027-01-15T08:05:00Z",
        names.RECLAIMED_FOR_ANNOTATION: "ml/st",
    }
    raw = [
        pod("st-0", gang="st", node="n1", min_member=1, annotations=bounds),
        pod("st-1", gang="st", node="n1", min_member=1, annotations=bounds),
        pod("st-2", gang="st", node="n2", min_member=1, annotations=leave),
    ]
    feed, _, _ = _web(raw)
    printed = views.why(cluster(raw), SCHED, "ml", "st", NOW)
    assert printed is not None
    assert (
        _row(feed, "ml/st")["why"]
        == printed["decision"]
        == (
            "Admitted: 3 of min 1 (max 2) bound, above its maximum 2: the youngest leave. "
            "ml/st-2 is asked to leave by 2027-01-15T08:05:00Z (its gang's maximum is 2)."
        )
    )


def test_a_gang_waiting_for_room_reclaimed_for_it_says_so_as_kubectl_shoal_why() -> None:
    victim = {
        names.LEAVE_BY_ANNOTATION: "2027-01-15T08:05:00Z",
        names.RECLAIMED_FOR_ANNOTATION: "ml/big",
    }
    raw = [
        pod("big-0", gang="big", min_member=2, gpus=8),
        pod("big-1", gang="big", min_member=2, gpus=8),
        pod("low-0", gang="low", node="n1", min_member=1, gpus=8, annotations=victim),
    ]
    feed, _, _ = _web(raw)
    printed = views.why(cluster(raw), SCHED, "ml", "big", NOW)
    assert printed is not None
    row = _row(feed, "ml/big")
    assert row["why"] == printed["decision"]
    assert row["why"].startswith("Waiting for room being reclaimed for it: 0 of min 2 (max 2)")


def _bounded(minimum: int, maximum: int) -> list[dict[str, Any]]:
    notes = {names.MAX_MEMBER_ANNOTATION: str(maximum)}
    return [
        pod(f"st-{i}", gang="st", node="n1", min_member=minimum, annotations=notes)
        for i in range(4)
    ]


def test_each_change_of_a_gangs_bounds_is_kept_with_its_time_on_the_gang_and_timeline() -> None:
    feed, _, _ = _web(_bounded(1, 4), clock=AT - 60)
    for minimum, maximum, at in ((1, 4, AT - 30), (1, 2, AT), (2, 2, AT + 5), (1, 4, AT + 7)):
        snap = snapshot([node("n1", gpus=8)], [convert.pod(p) for p in _bounded(minimum, maximum)])
        gangs, invalid = build_gangs(snap.pods.values(), snap.pod_groups, SCHED)
        feed.observe(snap, gangs, invalid, at)
    row = _row(feed, "ml/st")
    assert [c["text"] for c in row["boundChanges"]] == [
        "max 4 -> 2 at 10:02:03",  # the first sight and an unchanged cycle say nothing
        "min 1 -> 2 at 10:02:08",
        "min 2 -> 1, max 2 -> 4 at 10:02:10",
    ]
    assert row["boundChanges"][0]["at"] == AT
    doc = feed.document()
    assert doc is not None
    assert [(e["kind"], e["gang"], e["text"]) for e in doc["timeline"]] == [
        ("bounds", "ml/st", "ml/st max 4 -> 2"),
        ("bounds", "ml/st", "ml/st min 1 -> 2"),
        ("bounds", "ml/st", "ml/st min 2 -> 1, max 2 -> 4"),
    ]


def test_a_torn_gang_shows_what_it_was_told_as_kubectl_shoal_why() -> None:
    raw = [
        pod("st-0", gang="st", node="n1", min_member=3),
        pod("st-1", gang="st", min_member=3),
    ]
    feed, gangs, _ = _web(raw)
    (gang,) = gangs
    Tee(_Inner(), feed).torn(gang, NOW + 60)
    told = below_minimum_message(gang.name, Shortfall.of(gang), NOW + 60)
    printed = views.why(
        cluster(raw, [event("st-0", "GangBelowMinimum", told, "2027-01-15T08:01:00Z")]),
        SCHED,
        "ml",
        "st",
        NOW,
    )
    assert printed is not None
    row = _row(feed, "ml/st")
    assert row["reasonCode"] == "GangBelowMinimum"
    assert row["why"] == printed["decision"]
    assert row["why"] == f"Below its minimum after being admitted: 1 of min 3 (max 3) bound. {told}"


def test_the_page_shows_why_and_the_bound_changes() -> None:
    """The page's script reads the document's fields for them (the browser test is
    tests/integration/scheduler/test_web_view.py)."""
    script = (Path(server.__file__).with_name("static") / "app.js").read_text()
    assert "gang.why" in script
    assert "gang.boundChanges" in script
    page = (Path(server.__file__).with_name("static") / "index.html").read_text()
    assert "<th>why</th><th>bound changes</th>" in page


def test_bounds_are_compared_at_most_every_half_second_of_the_loops_time() -> None:
    """The loop pays the comparison (a cost per gang) at most twice a second, not every cycle:
    a change is kept at the first comparison after it, with that comparison's time."""
    feed, _, _ = _web(_bounded(1, 4), clock=AT)

    def cycle(maximum: int, at: float) -> list[str]:
        snap = snapshot([node("n1", gpus=8)], [convert.pod(p) for p in _bounded(1, maximum)])
        gangs, invalid = build_gangs(snap.pods.values(), snap.pod_groups, SCHED)
        feed.observe(snap, gangs, invalid, at)
        return [c["text"] for c in _row(feed, "ml/st")["boundChanges"]]

    assert cycle(2, AT + 0.1) == []  # not compared yet
    assert cycle(2, AT + 0.4) == []
    assert cycle(2, AT + BOUNDS_EVERY) == ["max 4 -> 2 at 10:02:03"]
    assert cycle(4, AT + 0.7) == ["max 4 -> 2 at 10:02:03"]
    assert cycle(2, AT + 0.8) == ["max 4 -> 2 at 10:02:03"]  # undone before the next compare
    assert cycle(2, AT + 1.0) == ["max 4 -> 2 at 10:02:03"]
