"""Annotations and PodGroups are written by users: every parser either gives a value or says
what is wrong with the input, in its own error type. Nothing else may come out of it."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts import gputopology, names
from contracts.times import EARLIEST, LATEST
from nodeagent.adapters.k8s import decode_revocation, encode_revocation
from nodeagent.adapters.k8s.cluster import _pod
from nodeagent.core.events import EventId, Kind, Notice, Tracked, parse_rfc3339
from nodeagent.core.store import Store
from scheduler.gang import build_gangs
from scheduler.gang.kinds.scheduler_plugins import SchedulerPlugins
from tests.unit.fuzz.cases import Cases, json_values, mutate, said, search, times
from tests.unit.scheduler.builders import SCHED, pod

pytestmark = pytest.mark.reliability

VALID_TOPOLOGY = json.loads(gputopology.encode(gputopology.uniform(4, 2)))
VALID_TOPOLOGY["allocated"] = {"1": "team-a/trainer-0"}


def test_gpu_topology_annotation() -> None:
    cases = Cases("gpu-topology annotation")

    @search(1000)
    @given(
        st.one_of(
            mutate(VALID_TOPOLOGY).map(json.dumps),
            json_values.map(json.dumps),
            st.text(max_size=200),
            st.integers(1, 5000).map(lambda depth: "[" * depth + "]" * depth),
        )
    )
    def run(text: str) -> None:
        cases()
        try:
            topology = gputopology.decode(text)
        except gputopology.TopologyError as exc:
            said(exc)
            return
        # What is accepted is consistent: it encodes and decodes to itself.
        assert gputopology.decode(gputopology.encode(topology)) == topology
        assert set(topology.allocated) <= {g.index for g in topology.gpus}

    run()
    cases.record()


COUNTS = st.one_of(
    st.integers(-(10**20), 10**20).map(str),
    st.sampled_from(["", " 4 ", "4.0", "+3", "-0", "٣", "1e3", "0x10", "1_000", "999999999999"]),
    st.text(max_size=12),
)


def test_gang_annotations() -> None:
    cases = Cases("gang annotations")

    @search(800)
    @given(
        st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    names.MIN_MEMBER_ANNOTATION: COUNTS,
                    names.MAX_MEMBER_ANNOTATION: COUNTS,
                    names.TOPOLOGY_REQUIRED_ANNOTATION: st.text(max_size=20),
                    names.TOPOLOGY_PREFERRED_ANNOTATION: st.text(max_size=20),
                },
            ),
            min_size=1,
            max_size=4,
        )
    )
    def run(annotations: list[dict[str, str]]) -> None:
        cases()
        members = [pod(f"w-{i}", gang="g", annotations=a) for i, a in enumerate(annotations)]
        gangs, invalid = build_gangs(members, {}, SCHED)
        assert len(gangs) + len(invalid) == 1
        for gang in gangs:
            assert 1 <= gang.min_member <= gang.max_member
        for bad in invalid:
            # The message names the annotation the user has to fix.
            assert "shoal.dev/" in bad.message

    run()
    cases.record()


def pod_group_objects() -> st.SearchStrategy[dict[str, Any]]:
    """PodGroups as the API server hands them over: its schema holds, the values are anyone's."""
    annotations = st.fixed_dictionaries(
        {},
        optional={
            names.MAX_MEMBER_ANNOTATION: COUNTS,
            names.TOPOLOGY_REQUIRED_ANNOTATION: st.text(max_size=20),
            names.TOPOLOGY_PREFERRED_ANNOTATION: st.text(max_size=20),
        },
    )
    metadata = st.fixed_dictionaries(
        {"namespace": st.just("team-a"), "name": st.just("job"), "uid": st.text(max_size=8)},
        optional={"annotations": annotations, "creationTimestamp": times},
    )
    spec = st.fixed_dictionaries(
        {}, optional={"minMember": st.one_of(st.integers(-(2**31), 2**31 - 1), json_values)}
    )
    return st.fixed_dictionaries({"metadata": metadata}, optional={"spec": spec})


def test_pod_groups() -> None:
    cases = Cases("PodGroup")

    @search(800)
    @given(pod_group_objects(), st.integers(1, 4))
    def run(raw: dict[str, Any], count: int) -> None:
        cases()
        group = SchedulerPlugins().convert(raw, {})
        members = [pod(f"w-{i}", namespace="team-a", pod_group="job") for i in range(count)]
        gangs, invalid = build_gangs(members, {"team-a/job": group}, SCHED)
        assert len(gangs) + len(invalid) == 1
        for gang in gangs:
            assert 1 <= gang.min_member <= gang.max_member
        for bad in invalid:
            assert "PodGroup team-a/job" in bad.message

    run()
    cases.record()


def _revocation() -> dict[str, Any]:
    notice = Notice(
        event_id=EventId("aws-spot-1"),
        source="aws",
        channel="aws/spot",
        kind=Kind.TERMINATE,
        deadline=datetime(2026, 11, 30, 10, 2, tzinfo=UTC),
        reason="EC2 spot interruption: terminate",
    )
    first = Tracked(notice=notice, first_seen=datetime(2026, 11, 30, 10, tzinfo=UTC))
    doc: dict[str, Any] = json.loads(encode_revocation([first]))
    return doc


def test_the_agents_own_annotations() -> None:
    """``shoal.dev/revocation`` on the node and ``shoal.dev/leave-by`` on pods are what a
    restarted agent resumes from; anyone with write access to them can damage them."""
    cases = Cases("agent annotations (revocation, leave-by)")
    now = _revocation()["notices"][0]["first_seen"]

    @search(800)
    @given(
        st.one_of(mutate(_revocation()).map(json.dumps), st.text(max_size=100)),
        times,
    )
    def run(revocation: str, leave_by: str) -> None:
        cases()
        try:
            tracked = decode_revocation(revocation)
        except ValueError as exc:
            said(exc)
            tracked = []
        # What is accepted can be resumed from: the store takes it and plans its actions.
        store = Store()
        store.restore(tracked)
        pod = _pod(
            {
                "metadata": {
                    "namespace": "team-a",
                    "name": "trainer-0",
                    "uid": "u-0",
                    "annotations": {names.LEAVE_BY_ANNOTATION: leave_by},
                }
            }
        )
        assert pod.leave_by is None or EARLIEST <= pod.leave_by < LATEST
        store.set_pods([pod])
        for t in tracked:
            assert EARLIEST <= t.notice.deadline < LATEST
        store.due(parse_rfc3339(now))
        if tracked:
            # Written back (to the second, as Kubernetes writes times), it reads the same.
            text = encode_revocation(tracked)
            assert encode_revocation(decode_revocation(text)) == text

    run()
    cases.record()
