"""The ``shoal.dev/progress`` document: what the agent writes is what the scheduler reads, and
a bad document is refused with the field named (the reader then treats the loss as unknown)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts import progress
from contracts.progress import Progress, ProgressError

NOW = 1_796_000_000.0


@given(
    step=st.integers(0, 10**9),
    done=st.integers(0, 10**9),
    step_seconds=st.floats(0, 3600, allow_nan=False),
    checkpoint_seconds=st.floats(0, 3600, allow_nan=False),
    checkpointed=st.booleans(),
)
def test_a_report_survives_the_annotation(
    step: int, done: int, step_seconds: float, checkpoint_seconds: float, checkpointed: bool
) -> None:
    report = Progress(
        step=max(step, done),
        step_seconds=round(step_seconds, 3),
        checkpoint_step=min(step, done),
        checkpoint_at=NOW - 30 if checkpointed else None,
        checkpoint_seconds=round(checkpoint_seconds, 3),
        reported_at=NOW,
    )
    assert progress.decode(progress.encode(report)) == report


def test_the_loss_grows_with_the_steps_since_the_checkpoint_and_the_time_since_the_report() -> None:
    report = Progress(1200, 0.5, 1000, NOW - 100, 40.0, NOW)
    assert report.steps_at_risk() == 200
    assert report.seconds_at_risk(NOW) == pytest.approx(100.0)
    assert report.seconds_at_risk(NOW + 20) == pytest.approx(120.0)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"v": 2}, "v"),
        ({"step": -1}, "step"),
        ({"step": True}, "step"),
        ({"checkpointStep": 5000}, "checkpointStep"),
        ({"stepSeconds": "fast"}, "stepSeconds"),
        ({"checkpointSeconds": 1e9}, "checkpointSeconds"),
        ({"reportedAt": "yesterday"}, "reportedAt"),
        ({"checkpointAt": "2026-12-02T10:00:00"}, "checkpointAt"),
    ],
)
def test_a_bad_document_is_refused_naming_the_field(change: dict[str, object], field: str) -> None:
    document = json.loads(progress.encode(Progress(1200, 0.5, 1000, NOW - 100, 40.0, NOW)))
    document.update(change)
    with pytest.raises(ProgressError, match=field):
        progress.decode(json.dumps(document))
    assert progress.decode_or_none(json.dumps(document)) is None


def test_garbage_and_oversized_documents_are_refused() -> None:
    for text in ("", "[]", "{", "x" * 5000):
        assert progress.decode_or_none(text) is None
