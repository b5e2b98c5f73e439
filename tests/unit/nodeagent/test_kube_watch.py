"""The Kubernetes-side signals are watched, not polled: a configured taint on the node, an
Event of a configured reason about one of this node's pods, or a configured condition on one of
them, is a notice as soon as a watch sees it, and nothing is lost when the watch breaks (it
resumes from its version, or lists again on ``410 Gone`` and finds what appeared meanwhile).
The feeds are scripted stand-ins for the port (:class:`nodeagent.core.ports.Feed`); the real
ones
are tested against the devcluster's API server (tests/integration/nodeagent/test_agent.py,
tests/integration/reliability/test_api_server.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime

from nodeagent.adapters.calls import WatchExpired
from nodeagent.adapters.follow import WatchSettings
from nodeagent.adapters.k8s import Cluster, ConditionRule
from nodeagent.adapters.providers.kube import KubeEventProvider, KubePodProvider, KubeTaintProvider
from nodeagent.core.events import NodeTaints, Notice, Pod, PodEvent, PodKey, PodUid
from nodeagent.core.ports import Change, ProviderError
from tests.unit.nodeagent.scripted_feed import Scripted, until

NOW = datetime(2026, 12, 1, 4, 0, tzinfo=UTC)
FAST = WatchSettings(retry_after=0.05, max_backoff=0.1)
AUTOSCALER: NodeTaints = (("ToBeDeletedByClusterAutoscaler", "1700000000"),)
W0 = Pod(PodKey("ns/w0"), PodUid("u0"))


class Sink:
    def __init__(self) -> None:
        self.observed_: list[list[Notice]] = []
        self.errors: list[ProviderError] = []

    def observed(self, channel: str, notices: Sequence[Notice]) -> None:
        self.observed_.append(list(notices))

    def failed(self, channel: str, error: ProviderError) -> None:
        self.errors.append(error)

    def ids(self) -> list[str]:
        return [n.event_id for n in self.observed_[-1]] if self.observed_ else []


async def watching(
    provider: KubeTaintProvider | KubeEventProvider, sink: Sink
) -> asyncio.Task[None]:
    return asyncio.create_task(provider.watch(sink))


async def stopped(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_taint_is_a_notice_as_soon_as_the_watch_sees_it_and_its_removal_withdraws_it() -> (
    None
):
    feed: Scripted[NodeTaints] = Scripted([()])
    sink = Sink()
    provider = KubeTaintProvider(feed, clock=lambda: NOW, interval=0.05, settings=FAST)
    task = await watching(provider, sink)
    try:
        await until(lambda: feed.watched_from == ["10"])
        assert sink.ids() == []
        feed.steps.put(Change(AUTOSCALER, gone=False, version="11"))
        await until(lambda: sink.ids() == ["kube-taint-ToBeDeletedByClusterAutoscaler"])
        (notice,) = sink.observed_[-1]
        assert (notice.source, notice.deadline) == ("kubernetes", NOW + provider.lead)
        assert "ToBeDeletedByClusterAutoscaler=1700000000" in notice.reason
        feed.steps.put(Change((("karpenter.sh/other", ""),), gone=False, version="12"))
        await until(lambda: sink.ids() == [])
        assert feed.lists == 1  # one list, then only the watch
    finally:
        await stopped(task)


async def test_a_taint_that_appears_while_the_watch_is_broken_is_still_seen() -> None:
    feed: Scripted[NodeTaints] = Scripted([()])
    sink = Sink()
    provider = KubeTaintProvider(feed, clock=lambda: NOW, interval=0.05, settings=FAST)
    task = await watching(provider, sink)
    try:
        await until(lambda: feed.watched_from == ["10"])
        feed.steps.put(Change(None, gone=False, version="20"))  # a bookmark
        # The API server goes away: the watch breaks, the list fails, the channel says why.
        feed.list_error = ConnectionRefusedError("connection refused")
        feed.steps.put(ConnectionResetError("the watch broke"))
        await until(lambda: sink.errors)
        assert "the watch broke" in str(sink.errors[-1])
        # It comes back having forgotten version 20 (410 Gone) with the taint on the node:
        # the list shows it.
        feed.list_error = None
        feed.listed, feed.version = [AUTOSCALER], "90"
        feed.steps.put(WatchExpired("too old resource version"))
        feed.steps.put(Change(None, gone=False, version=""))  # the new watch is answered
        await until(lambda: sink.ids() == ["kube-taint-ToBeDeletedByClusterAutoscaler"])
        await until(lambda: feed.watched_from[-1:] == ["90"])
        assert feed.watched_from[:2] == ["10", "20"]
        # While the watch is open the channel is read (no request: the watch is current).
        reports = len(sink.observed_)
        await until(lambda: len(sink.observed_) >= reports + 2)
    finally:
        await stopped(task)


async def test_an_event_about_a_pod_on_this_node_is_a_notice_for_that_pod_only() -> None:
    feed: Scripted[PodEvent] = Scripted([])
    sink = Sink()
    here: dict[PodUid, Pod] = {}
    provider = KubeEventProvider(
        [feed], clock=lambda: NOW, interval=0.05, settings=FAST, pod_of=here.get
    )
    task = await watching(provider, sink)
    try:
        await until(lambda: feed.watched_from == ["10"])
        elsewhere = PodEvent("e1", PodUid("other"), "PreRelease", "released in 5 minutes")
        feed.steps.put(Change(elsewhere, gone=False, version="11"))
        warned = PodEvent("e2", W0.uid, "PreRelease", "released in 5 minutes")
        feed.steps.put(Change(warned, gone=False, version="12"))
        await until(lambda: len(sink.observed_) >= 3)
        assert sink.ids() == []  # neither pod is on this node yet
        here[W0.uid] = W0  # the pod watch sees w0 arrive: matched at the next report
        await until(lambda: sink.ids() == [f"kube-event-{W0.uid}"])
        (notice,) = sink.observed_[-1]
        assert notice.scope == frozenset({W0.key})
        assert "PreRelease: released in 5 minutes" in notice.reason
        feed.steps.put(Change(warned, gone=True, version="13"))  # the Event expired
        await until(lambda: sink.ids() == [])
    finally:
        await stopped(task)


async def test_a_pod_the_pod_watch_sees_with_a_configured_condition_is_a_notice_for_it() -> None:
    rules = frozenset({ConditionRule.parse("DisruptionTarget=True:PreemptionByScheduler")})
    parse = Cluster(transport=None, node_name="n1").pod_feed(rules).parse  # type: ignore[arg-type]
    raw = {
        "metadata": {"namespace": "ns", "name": "w0", "uid": "u0"},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"},
            ]
        },
    }
    warned = parse(raw)
    assert warned.warning == "condition DisruptionTarget=True (PreemptionByScheduler)"
    assert parse({**raw, "status": {}}).warning is None

    here = [warned, W0]
    provider = KubePodProvider(clock=lambda: NOW, pods=lambda: here)
    (notice,) = await provider.warned()
    assert (notice.event_id, notice.scope) == ("kube-pod-u0", frozenset({PodKey("ns/w0")}))
    assert "DisruptionTarget=True" in notice.reason
    here.pop(0)  # the pod watch saw it go
    assert await provider.warned() == []
