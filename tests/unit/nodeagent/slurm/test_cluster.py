"""The Slurm adapter's platform calls, through a stand-in for scontrol at the runner seam: the
exact commands a notice makes the agent run on a Slurm node, and what an administrator sees
(the node's state and reason, the jobs requeued or shrunk, their comments)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from nodeagent.adapters.slurm import OnNotice, Result, SlurmCluster
from nodeagent.core.events import EventId, Kind, Notice, Pod, PodKey, PodUid, Tracked
from tests.unit.nodeagent.slurm.fake_slurm import FakeSlurm, Job

DEADLINE = datetime(2026, 12, 2, 12, 30, tzinfo=UTC)
REASON = "shoal: aws terminate until 2026-12-02T12:30:00Z"


def notice(event_id: str = "spot-1", deadline: datetime = DEADLINE) -> Notice:
    return Notice(
        event_id=EventId(event_id),
        source="aws",
        channel="aws/spot",
        kind=Kind.TERMINATE,
        deadline=deadline,
        reason="spot interruption",
    )


def tracked(*notices: Notice) -> list[Tracked]:
    return [Tracked(notice=n, first_seen=datetime(2026, 12, 2, 12, tzinfo=UTC)) for n in notices]


def job_pod(job: str) -> Pod:
    return Pod(key=PodKey(f"slurm/{job}"), uid=PodUid(f"slurm:{job}"))


@pytest.fixture
def slurm() -> FakeSlurm:
    return FakeSlurm(
        jobs={
            "42": Job(steps={"batch": [101], "0": [102, 103]}, nodes=["gpu-1"]),
            "7": Job(steps={"0": [201]}, nodes=["gpu-0", "gpu-1", "gpu-2"]),
            "9": Job(steps={"0": [301]}, nodes=["gpu-0"]),  # elsewhere
        }
    )


def cluster(slurm: FakeSlurm, tmp_path: Path | None = None, **kw: object) -> SlurmCluster:
    return SlurmCluster("gpu-1", runner=slurm, state_dir=tmp_path, **kw)  # type: ignore[arg-type]


def test_the_jobs_with_a_step_on_this_node_are_its_pods(slurm: FakeSlurm) -> None:
    pods = cluster(slurm).list_pods()
    assert [(p.key, p.uid, p.worker) for p in pods] == [
        ("slurm/7", "slurm:7", True),
        ("slurm/42", "slurm:42", True),
    ]
    assert slurm.calls == [("scontrol", "listpids", "*", "gpu-1")]
    slurm.jobs.clear()
    assert cluster(slurm).list_pods() == []


def test_a_notice_drains_the_node_with_a_reason_that_says_which_and_until_when(
    slurm: FakeSlurm,
) -> None:
    c = cluster(slurm)
    c.sync_node(tracked(notice()))
    assert slurm.calls == [
        ("scontrol", "-o", "show", "node", "gpu-1"),
        ("scontrol", "update", "nodename=gpu-1", "state=drain", f"reason={REASON}"),
    ]
    assert (slurm.state, slurm.reason) == ("IDLE+DRAIN", REASON)
    # The same notice again changes nothing; an earlier deadline says so in the reason.
    c.sync_node(tracked(notice()))
    assert len(slurm.writes()) == 1
    c.sync_node(tracked(notice(deadline=datetime(2026, 12, 2, 12, 20, tzinfo=UTC))))
    assert slurm.reason == "shoal: aws terminate until 2026-12-02T12:20:00Z"


def test_a_withdrawn_notice_resumes_only_a_node_drained_by_the_agent(slurm: FakeSlurm) -> None:
    c = cluster(slurm)
    c.sync_node(tracked(notice()))
    c.sync_node([])
    assert slurm.writes()[-1] == ("scontrol", "update", "nodename=gpu-1", "state=resume")
    assert (slurm.state, slurm.reason) == ("IDLE", "")
    # An administrator's drain is theirs: neither replaced by a notice nor resumed after it.
    slurm.state, slurm.reason = "IDLE+DRAIN", "bad DIMM, ticket 1234"
    c.sync_node(tracked(notice("spot-2")))
    c.sync_node([])
    assert (slurm.state, slurm.reason) == ("IDLE+DRAIN", "bad DIMM, ticket 1234")
    assert len(slurm.writes()) == 2


def test_a_drain_that_slurm_refuses_fails_the_action_so_it_is_tried_again(
    slurm: FakeSlurm,
) -> None:
    refusal = Result(("scontrol",), 1, "", "slurm_update error: Access/permission denied\n")
    slurm.answers[("update", "nodename=gpu-1", "state=drain", f"reason={REASON}")] = refusal
    with pytest.raises(Exception, match="Access/permission denied"):
        cluster(slurm).sync_node(tracked(notice()))


def test_an_acknowledged_job_is_requeued_with_a_comment_saying_why(slurm: FakeSlurm) -> None:
    c = cluster(slurm)
    c.annotate_pod(job_pod("42"), notice())
    assert c.evict(job_pod("42"), "acknowledged")
    assert slurm.writes() == [
        ("scontrol", "requeue", "42"),
        (
            "scontrol",
            "update",
            "jobid=42",
            "admincomment=shoal: requeued off gpu-1: aws terminate until 2026-12-02T12:30:00Z",
        ),
    ]
    assert slurm.requeued == ["42"]
    # Pending since (or gone): nothing left to hand back, and nothing to try again.
    assert c.evict(job_pod("42"), "deadline")
    assert slurm.requeued == ["42"]
    del slurm.jobs["42"]
    assert c.evict(job_pod("42"), "deadline")


def test_a_job_slurm_will_not_requeue_is_tried_again_later(slurm: FakeSlurm) -> None:
    slurm.jobs["42"].requeue = False
    assert not cluster(slurm).evict(job_pod("42"), "deadline")
    assert slurm.requeued == []


def test_shrink_takes_the_node_out_of_a_job_that_has_others_and_requeues_the_rest(
    slurm: FakeSlurm,
) -> None:
    c = cluster(slurm, on_notice=OnNotice.SHRINK)
    c.annotate_pod(job_pod("7"), notice())
    assert c.evict(job_pod("7"), "acknowledged")
    assert ("scontrol", "update", "jobid=7", "nodelist=gpu-0,gpu-2") in slurm.writes()
    assert slurm.jobs["7"].nodes == ["gpu-0", "gpu-2"]
    assert slurm.comments["7"].startswith("shoal: shrunk off gpu-1: aws terminate")
    # A job on this node alone cannot shrink to nothing: it is requeued.
    assert c.evict(job_pod("42"), "acknowledged")
    assert slurm.requeued == ["42"]


def test_none_leaves_the_job_to_slurm(slurm: FakeSlurm) -> None:
    c = cluster(slurm, on_notice=OnNotice.NONE)
    assert c.evict(job_pod("42"), "deadline")
    assert c.delete(job_pod("42"), 3)
    assert slurm.writes() == []


def test_a_dry_run_reads_slurm_and_changes_nothing(slurm: FakeSlurm) -> None:
    c = cluster(slurm, dry_run=True)
    c.sync_node(tracked(notice()))
    assert c.evict(job_pod("42"), "acknowledged")
    assert slurm.writes() == []
    assert (slurm.state, slurm.requeued) == ("IDLE", [])


def test_a_restarted_agent_knows_what_it_drained_under_and_which_jobs_it_told(
    slurm: FakeSlurm, tmp_path: Path
) -> None:
    first = cluster(slurm, tmp_path)
    first.sync_node(tracked(notice()))
    first.annotate_pod(job_pod("42"), notice())
    again = cluster(slurm, tmp_path)
    assert [t.notice for t in again.read_revocation()] == [notice()]
    leave_by = {p.key: p.leave_by for p in again.list_pods()}
    assert leave_by == {"slurm/7": None, "slurm/42": DEADLINE}
    # A damaged record is no record (and one log line), never a crash.
    (tmp_path / "slurm.json").write_text("{not json")
    assert cluster(slurm, tmp_path).read_revocation() == []
