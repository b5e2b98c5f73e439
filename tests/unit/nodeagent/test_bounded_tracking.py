"""A long-running agent sees notices come and go for months: what it tracks per notice is let go
with the notice, so its memory does not grow with every notice it ever saw."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from nodeagent.adapters.metrics import Metrics
from nodeagent.core.events import EventId, Kind, Notice
from nodeagent.core.store import Store
from nodeagent.wiring.channels import Channels
from nodeagent.wiring.intake import Intake

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def notice(n: int, channel: str) -> Notice:
    return Notice(
        event_id=EventId(f"{channel}-{n}"),
        source="aws",
        channel=channel,
        kind=Kind.TERMINATE,
        deadline=T0 + timedelta(minutes=2),
        reason="spot",
    )


def test_notices_that_come_and_go_leave_no_tracking_behind() -> None:
    metrics = Metrics()
    store = Store()
    intake = Intake(
        store, Channels(metrics), metrics, node_name="n1", clock=lambda: T0, wake=lambda: None
    )
    for n in range(2000):
        # two channels, each holding one notice at a time that the next read replaces
        intake.observed("aws/spot", [notice(n, "aws/spot")])
        intake.observed("aws/rebalance", [notice(n, "aws/rebalance")] if n % 3 else [])
        live = {t.notice.event_id for t in store.active()}
        assert intake.detected_at(notice(n, "aws/spot").event_id) is not None
        assert len(intake._detected) <= len(live) <= 2
    assert intake.detected_at(notice(0, "aws/spot").event_id) is None
    intake.observed("aws/spot", [])
    intake.observed("aws/rebalance", [])
    assert store.active() == ()
    assert intake._detected == {}
