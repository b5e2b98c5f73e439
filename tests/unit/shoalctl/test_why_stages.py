"""``kubectl shoal why`` after a stage change: a lowered maximum (members leaving for their own
gang) and a raised minimum (running, waiting for room)."""

from __future__ import annotations

from contracts import names
from shoalctl import views
from tests.unit.shoalctl.test_views_and_render import NOW, SCHED, cluster, event, pod


def test_why_says_a_gang_above_its_lowered_maximum_sheds_its_youngest() -> None:
    leave = {
        names.MAX_MEMBER_ANNOTATION: "2",
        names.LEAVE_BY_ANNOTATION: "2027-01-15T08:05:00Z",
        names.RECLAIMED_FOR_ANNOTATION: "ml/st",
    }
    c = cluster(
        [
            pod(
                "st-0",
                gang="st",
                node="n1",
                min_member=1,
                annotations={"shoal.dev/max-member": "2"},
            ),
            pod(
                "st-1",
                gang="st",
                node="n1",
                min_member=1,
                annotations={"shoal.dev/max-member": "2"},
            ),
            pod("st-2", gang="st", node="n2", min_member=1, annotations=leave),
        ]
    )
    found = views.why(c, SCHED, "ml", "st", NOW)
    assert found is not None
    assert found["decision"] == (
        "Admitted: 3 of min 1 (max 2) bound, above its maximum 2: the youngest leave. "
        "ml/st-2 is asked to leave by 2027-01-15T08:05:00Z (its gang's maximum is 2)."
    )


def test_why_says_a_gang_with_a_raised_minimum_runs_and_what_it_waits_for() -> None:
    waits = (
        "Gang st runs with 2 member(s) bound, below its raised minimum 4; they keep running "
        "while it waits for room for 2 more: 0/2 nodes are available: 2 Insufficient "
        "nvidia.com/gpu."
    )
    c = cluster(
        [
            pod("st-0", gang="st", node="n1", min_member=4),
            pod("st-1", gang="st", node="n1", min_member=4),
            pod("st-2", gang="st", min_member=4),
            pod("st-3", gang="st", min_member=4),
        ],
        [event("st-2", "WaitingForRoom", waits, "2027-01-15T08:01:00Z")],
    )
    found = views.why(c, SCHED, "ml", "st", NOW)
    assert found is not None
    assert found["reasonCode"] == "WaitingForRoom"
    assert found["decision"] == (
        f"Running below its raised minimum: 2 of min 4 (max 4) bound. {waits}"
    )
