"""Gangs torn below their minimum, on the devcluster: told where a user looks, released only
through the notice path, and never threatened for a healthy scale-up.

- A burst of deletions (every pending pod, whole bound gangs, some members of bound gangs) once
  left the torn gangs' only ``GangBelowMinimum`` Event on members deleted in the same burst;
  now it is on the surviving members, rewritten there when the members it was on go.
- A running gang whose minimum was raised above what is bound, with no room for the rest, was
  told "waiting for -1 more member(s)" and then evicted within milliseconds of its release;
  now its members are asked to leave (``shoal.dev/leave-by``, heard on the node agent's socket)
  and evicted once they acknowledge, or at the leave-by, and the messages count what is true.
- Raising a gang's minimum and maximum together, with room for the new members, once drew a
  ``GangBelowMinimum`` warning threatening eviction; now the members just bind.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import watch
from shoal_worker import PodIdentity

from contracts import names
from contracts.times import parse_time_or
from tests import figures
from tests.integration.nodeagent.harness import AgentProcess, Worker
from tests.integration.scheduler.conftest import Pods, Pool, SchedulerProcess
from tests.waiting import eventually

pytestmark = pytest.mark.reliability

SECTION = "torn gangs"
BELOW = "GangBelowMinimum"
#: A negative count ("waiting for -1 more"), not a date's hyphen.
NEGATIVE = re.compile(r"(?<!\d)-\d")


def _events(pods: Pods, name: str, reason: str) -> list[Any]:
    return [e for e in pods.events(name) if e.reason == reason]


def _delete_all(pods: Pods, names_: list[str]) -> None:
    """Delete ``names_`` at once, as a user deleting many jobs or a controller's burst does."""
    with ThreadPoolExecutor(max_workers=8) as pool_:
        list(pool_.map(lambda n: pods.delete([n]), names_))


def _patch_sizes(pods: Pods, names_: list[str], **sizes: int) -> None:
    notes = {}
    if "min_member" in sizes:
        notes[names.MIN_MEMBER_ANNOTATION] = str(sizes["min_member"])
    if "max_member" in sizes:
        notes[names.MAX_MEMBER_ANNOTATION] = str(sizes["max_member"])
    core = pods.devcluster.core()
    for name in names_:
        core.patch_namespaced_pod(name, pods.namespace, {"metadata": {"annotations": notes}})


def test_a_burst_of_deletions_leaves_each_torn_gang_explained_on_its_survivors(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    # Room for 6 gangs of 4 (2 GPUs each) out of 12; the scaled-down burst of the 40-gang case.
    pool.add(6, gpus=8)
    start_scheduler("--torn-grace", "600")
    gangs = {f"g{i:02d}": pods.gang(f"g{i:02d}", 4, gpus=2, min_member=4) for i in range(12)}
    every = [m for members in gangs.values() for m in members]
    eventually(lambda: len(pods.bound(every)) == 24, what="6 whole gangs bound")
    bound = pods.bound(every)
    whole = sorted(g for g, members in gangs.items() if all(m in bound for m in members))
    assert len(whole) == 6, whole
    pending = [m for m in every if m not in bound]
    gone_whole, torn, _untouched = whole[:2], whole[2:5], whole[5:]

    # One burst: every pending pod, two whole bound gangs, the first member of three others.
    first = [gangs[g][0] for g in torn]
    _delete_all(pods, pending + [m for g in gone_whole for m in gangs[g]] + first)
    burst_at = time.monotonic()

    def told_on_survivors(count: int) -> bool:
        for g in torn:
            survivors = gangs[g][4 - count :]
            if not any(
                f"{count} of 4 bound" in e.message
                for s in survivors
                for e in _events(pods, s, BELOW)
            ):
                return False
        return True

    eventually(lambda: told_on_survivors(3), timeout=10, what="each torn gang told on a survivor")
    first_told = time.monotonic() - burst_at

    # The members the first explanation may have been written on go too: it must follow the
    # gang to the members that are left.
    second = [gangs[g][1] for g in torn]
    _delete_all(pods, second)
    second_at = time.monotonic()
    eventually(
        lambda: told_on_survivors(2),
        timeout=10,
        what="each torn gang told '2 of 4 bound' on its surviving members",
    )
    retold = time.monotonic() - second_at
    for g in torn:
        for survivor in gangs[g][2:]:
            messages = [e.message for e in _events(pods, survivor, BELOW)]
            assert any("2 of 4 bound" in m for m in messages), (survivor, messages)
            assert any("waiting for 2 more member(s) to be created" in m for m in messages)
            assert not any(NEGATIVE.search(m) for m in messages), messages
    figures.record(SECTION, "burst: torn gang told on a survivor after (s)", round(first_told, 2))
    figures.record(
        SECTION, "burst: told again on the survivors after its members went (s)", round(retold, 2)
    )


@dataclass
class PodTimeline:
    """When this process saw each pod first carry ``shoal.dev/leave-by``, and first being
    evicted (``DisruptionTarget``, a deletion timestamp, or gone): a watch of its own, which
    delivers every change in order."""

    core: Any
    namespace: str
    leave_by_seen: dict[str, tuple[float, str]] = field(default_factory=dict)
    evicted_seen: dict[str, float] = field(default_factory=dict)
    #: Pods whose eviction came before any version of them carried the annotation.
    unannounced: set[str] = field(default_factory=set)
    failed: Exception | None = None
    _stopped: bool = False

    def __post_init__(self) -> None:
        self._watch = watch.Watch()
        listing = self.core.list_namespaced_pod(self.namespace)
        self._thread = threading.Thread(
            target=self._run, args=(listing.metadata.resource_version,), daemon=True
        )
        self._thread.start()

    def _run(self, version: str) -> None:
        try:
            for event in self._watch.stream(
                self.core.list_namespaced_pod, self.namespace, resource_version=version
            ):
                self._saw(event["type"], event["object"], time.time())
        except Exception as exc:  # a gap in the record must fail the test, not hide
            if not self._stopped:
                self.failed = exc

    def _saw(self, kind: str, pod: Any, now: float) -> None:
        name = pod.metadata.name
        notes = pod.metadata.annotations or {}
        if names.LEAVE_BY_ANNOTATION in notes and name not in self.leave_by_seen:
            self.leave_by_seen[name] = (now, notes[names.LEAVE_BY_ANNOTATION])
        disrupted = any(
            c.type == "DisruptionTarget" and c.status == "True"
            for c in (pod.status.conditions or [])
        )
        leaving = kind == "DELETED" or pod.metadata.deletion_timestamp is not None
        if (disrupted or leaving) and name not in self.evicted_seen:
            self.evicted_seen[name] = now
            if name not in self.leave_by_seen:
                self.unannounced.add(name)

    def check(self) -> None:
        assert self.failed is None, f"the pod watch broke: {self.failed!r}"

    def stop(self) -> None:
        self._stopped = True
        self._watch.stop()


def test_a_gang_whose_minimum_was_raised_without_room_is_released_through_the_notice(
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    tmp_path: Path,
) -> None:
    (node,) = pool.add(1, gpus=8)
    members = pods.gang("grow", 4, gpus=4, min_member=2, max_member=4)
    grace = 8
    start_scheduler("--torn-grace", "2", "--reclaim-grace", str(grace))
    running = eventually(
        lambda: pods.bound(members) if len(pods.bound(members)) == 2 else None,
        what="the gang's minimum bound",
    )
    acks, waits = sorted(running)
    core = pods.devcluster.core()
    agent = AgentProcess(
        kubeconfig=str(pods.devcluster.kubeconfig),
        node=node,
        provider="none",
        metadata_url="http://127.0.0.1:9",
        workdir=tmp_path,
    )
    agent.start()
    worker = Worker(
        PodIdentity(pods.namespace, acks, pods.read(acks).metadata.uid), agent.socket_path
    )
    timeline = PodTimeline(core, pods.namespace)
    try:
        assert worker.next().state == "none"
        _patch_sizes(pods, members, min_member=3)
        raised_at = time.time()

        def below(name: str) -> list[Any]:
            return _events(pods, name, BELOW)

        told = eventually(
            lambda: below(acks) or below(waits), timeout=30, what="a GangBelowMinimum Event"
        )
        message = told[-1].message
        assert "2 of 3 bound" in message, message
        assert "2 members pending, no room for them" in message, message
        assert not NEGATIVE.search(message), message
        assert "to be created" not in message, message

        heard = worker.until("leave", timeout=60)
        heard_at = time.time()
        notes = pods.read(acks).metadata.annotations or {}
        assert (heard.source, heard.kind) == ("scheduler", "reclaim")
        assert heard.leave_by is not None
        assert heard.leave_by.timestamp() == parse_time_or(notes[names.LEAVE_BY_ANNOTATION], 0)
        assert worker.acknowledge(11) == "accepted"
        acked_at = time.time()

        gone = eventually(
            lambda: (acks in timeline.evicted_seen and waits in timeline.evicted_seen) or None,
            timeout=60,
            what="both running members evicted",
        )
        assert gone
        timeline.check()
        assert timeline.unannounced == set(), "evicted without shoal.dev/leave-by first"
        leave_by = parse_time_or(timeline.leave_by_seen[waits][1], 0)
        # The member that acknowledged went at once, the other at its leave-by, not before.
        assert timeline.evicted_seen[acks] < leave_by
        assert timeline.evicted_seen[waits] >= leave_by
        released = eventually(
            lambda: _events(pods, acks, "GangReleased") or _events(pods, waits, "GangReleased"),
            timeout=30,
            what="a GangReleased Event",
        )
        text = released[-1].message
        assert timeline.leave_by_seen[waits][1] in text, text
        assert "no member to complete it" not in text, text
        assert "2 members pending, no room for them" in text, text
        evicted = [
            line
            for line in agent.log_lines()
            if line.get("event") == "pod_evicted" and line.get("pod") == f"{pods.namespace}/{acks}"
        ]
        assert [line["reason"] for line in evicted] == ["acknowledged"]

        asked_at = timeline.leave_by_seen[acks][0]
        figures.record(
            SECTION,
            "raised minimum: raised to leave-by written (s)",
            round(asked_at - raised_at, 2),
        )
        figures.record(
            SECTION, "raised minimum: leave-by to socket notice (s)", round(heard_at - asked_at, 2)
        )
        figures.record(
            SECTION,
            "raised minimum: ack to eviction (s)",
            round(timeline.evicted_seen[acks] - acked_at, 2),
        )
        figures.record(
            SECTION,
            f"raised minimum: leave-by to eviction without ack (s, grace {grace} s)",
            round(timeline.evicted_seen[waits] - timeline.leave_by_seen[waits][0], 2),
        )
    finally:
        timeline.stop()
        worker.close()
        agent.stop()


def test_raising_minimum_and_maximum_together_with_room_binds_without_a_warning(
    pool: Pool, pods: Pods, start_scheduler: Callable[..., SchedulerProcess]
) -> None:
    pool.add(1, gpus=8)
    start_scheduler("--torn-grace", "2")
    members = pods.gang("scale", 4, gpus=2, min_member=2, max_member=2)
    eventually(lambda: len(pods.bound(members)) == 2, what="the gang at its maximum of 2")
    _patch_sizes(pods, members, min_member=4, max_member=4)
    raised = time.monotonic()
    eventually(lambda: len(pods.bound(members)) == 4, timeout=30, what="the new members bound")
    figures.record(
        SECTION, "scale-up: raised to all bound (s)", round(time.monotonic() - raised, 2)
    )
    # Written after the bindings, so after any warning the decision to bind them came with.
    eventually(
        lambda: all(_events(pods, m, "Scheduled") for m in members),
        timeout=30,
        what="the Scheduled Events of every member",
    )
    warned = [(m, e.message) for m in members for e in _events(pods, m, BELOW)]
    assert warned == []
    assert all(not _events(pods, m, "GangReleased") for m in members)
