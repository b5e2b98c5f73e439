"""The worker's side of progress reports (shoal_worker/progress.py): pacing (pure), and the
reporter's background thread, which never blocks the caller, sends the newest report, and stops
for good at an agent that does not know the call."""

from __future__ import annotations

import threading

from shoal_worker.progress import MIN_INTERVAL_S, Pacer, ProgressReporter, Report, StepTimer

from tests import waiting


def test_the_first_report_goes_at_once_and_then_at_most_one_per_interval_the_newest() -> None:
    pacer = Pacer(5.0)
    assert pacer.offer(Report(1), 100.0) == Report(1)
    assert pacer.due_in(100.0) is None
    assert pacer.offer(Report(2), 101.0) is None
    assert pacer.offer(Report(3), 102.0) is None
    assert pacer.due_in(102.0) == 3.0
    assert pacer.take(104.9) is None
    assert pacer.take(105.0) == Report(3)
    assert pacer.take(200.0) is None
    # After a quiet while, a report goes at once again.
    assert pacer.offer(Report(4), 300.0) == Report(4)


def test_the_default_interval_is_a_few_seconds() -> None:
    assert 1.0 <= MIN_INTERVAL_S <= 10.0


def test_a_report_names_what_is_wrong_with_it() -> None:
    assert Report(10, 0.5, 5, 1.8e9, 30.0).problem() is None
    assert Report(0).problem() is None
    assert "step" in str(Report(-1).problem())
    assert "checkpoint_step" in str(Report(5, checkpoint_step=6).problem())
    assert "step_seconds" in str(Report(5, step_seconds=float("nan")).problem())
    assert "checkpoint_seconds" in str(Report(5, checkpoint_seconds=-1.0).problem())
    assert "checkpoint_at" in str(Report(5, checkpoint_at=float("inf")).problem())


class Client:
    """Takes reports (or answers as an agent older than 0.2.0) and records them."""

    def __init__(self, known: bool = True) -> None:
        self.known = known
        self.reports: list[Report] = []
        self.release = threading.Event()
        self.release.set()

    async def report_progress(self, report: Report) -> bool:
        self.release.wait(10)
        self.reports.append(report)
        return self.known


def reporter(client: Client, interval: float) -> ProgressReporter:
    return ProgressReporter(client, interval)  # type: ignore[arg-type]


def test_the_reporter_sends_the_first_report_then_the_newest_after_the_interval() -> None:
    client = Client()
    client.release.clear()  # the first send hangs: report() must not
    sender = reporter(client, interval=2.0)
    try:
        for step in range(1, 6):
            sender.report(step, checkpoint_step=0)
        client.release.set()
        waiting.eventually(lambda: len(client.reports) >= 2, timeout=10, what="two reports sent")
        assert [r.step for r in client.reports] == [1, 5]
        assert sender.sent == 2
    finally:
        sender.close()


def test_an_agent_without_the_call_is_asked_once() -> None:
    client = Client(known=False)
    sender = reporter(client, interval=0.01)
    try:
        sender.report(1)
        waiting.eventually(lambda: not sender.supported, timeout=10, what="the call is unknown")
        for step in range(2, 10):
            sender.report(step)
        assert [r.step for r in client.reports] == [1]
    finally:
        sender.close()


def test_an_invalid_report_is_not_sent() -> None:
    client = Client()
    sender = reporter(client, interval=0.01)
    try:
        sender.report(5, checkpoint_step=9)
        sender.report(9, checkpoint_step=5)
        waiting.eventually(lambda: client.reports, timeout=10, what="the valid report sent")
        assert [r.step for r in client.reports] == [9]
    finally:
        sender.close()


def test_the_step_time_is_a_recent_mean_without_the_checkpoints() -> None:
    timer = StepTimer(weight=0.5)
    assert timer.stepped(0, 10.0) is None
    assert timer.stepped(1, 11.0) == 1.0
    assert timer.stepped(3, 14.0) == 1.25  # two steps of 1.5 s
    timer.paused(100.0)  # a checkpoint
    assert timer.stepped(4, 115.0) == 1.125
    assert timer.stepped(4, 200.0) == 1.125  # the same step again counts nothing
