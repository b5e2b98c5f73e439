"""The scheduler's reclaim reaches the victim's worker on the notice socket of its node's agent:
the real scheduler shrinks an elastic gang for a higher-priority one, the real agent watching the
victim's node turns the scheduler's ``shoal.dev/leave-by`` into a notice (source ``scheduler``,
deadline the leave-by), and the worker's acknowledgement has the agent evict it long before the
scheduler would."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from shoal_worker import PodIdentity

from contracts import names
from nodeagent.core.events import parse_rfc3339
from tests import figures
from tests.integration.nodeagent.harness import AgentProcess, Worker
from tests.integration.scheduler.conftest import Pods, Pool, SchedulerProcess, ensure_priority_class
from tests.waiting import eventually

SECTION = "scheduler reclaim notice"
#: Long enough that only an acknowledgement gets the victim out while the test looks.
GRACE = 600


class AnnotationClock:
    """When this process first saw the pod carry ``shoal.dev/leave-by`` (a watch of its own)."""

    def __init__(self, core: Any, namespace: str, name: str) -> None:
        self.seen_at: float | None = None
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, args=(core, namespace, name), daemon=True)
        self._thread.start()

    def _run(self, core: Any, namespace: str, name: str) -> None:
        for event in self._watch.stream(
            core.list_namespaced_pod,
            namespace,
            field_selector=f"metadata.name={name}",
            timeout_seconds=300,
        ):
            if names.LEAVE_BY_ANNOTATION in (event["object"].metadata.annotations or {}):
                self.seen_at = time.monotonic()
                self._watch.stop()

    def stop(self) -> None:
        self._watch.stop()


def gone(core: Any, namespace: str, name: str) -> bool:
    try:
        pod = core.read_namespaced_pod(name, namespace)
    except client.ApiException as exc:
        return bool(exc.status == 404)
    return pod.metadata.deletion_timestamp is not None


def test_a_reclaim_is_heard_on_the_socket_and_the_ack_evicts_the_victim(
    pool: Pool,
    pods: Pods,
    start_scheduler: Callable[..., SchedulerProcess],
    tmp_path: Path,
) -> None:
    ensure_priority_class(pods.devcluster, "shoal-test-high", 100000)
    pool.add(2, gpus=8)
    members = pods.gang("elastic", 2, gpus=8, min_member=1, max_member=2)
    start_scheduler("--reclaim-grace", str(GRACE))
    placed = eventually(
        lambda: pods.bound(members) if len(pods.bound(members)) == 2 else None,
        what="the elastic gang at its maximum",
    )
    victim = "elastic-1"  # the youngest surplus member
    core = pods.devcluster.core()
    uid = pods.read(victim).metadata.uid
    agent = AgentProcess(
        kubeconfig=str(pods.devcluster.kubeconfig),
        node=placed[victim],
        provider="none",
        metadata_url="http://127.0.0.1:9",
        workdir=tmp_path,
    )
    agent.start()
    worker = Worker(PodIdentity(pods.namespace, victim, uid), agent.socket_path)
    clock = AnnotationClock(core, pods.namespace, victim)
    try:
        assert worker.next().state == "none"
        urgent = pods.gang("urgent", 1, gpus=8, min_member=1, priority_class="shoal-test-high")

        heard = worker.until("leave", timeout=90)
        heard_at = time.monotonic()
        notes = pods.read(victim).metadata.annotations or {}
        assert (heard.source, heard.kind) == ("scheduler", "reclaim")
        assert heard.leave_by == parse_rfc3339(notes[names.LEAVE_BY_ANNOTATION])
        assert notes[names.RECLAIMED_FOR_ANNOTATION].endswith("/urgent")
        assert notes[names.RECLAIMED_FOR_ANNOTATION] in heard.reason
        seen_at = eventually(lambda: clock.seen_at, what="the test's own watch to see it")
        figures.record(SECTION, "annotation to socket notice (s)", round(heard_at - seen_at, 3))
        print(f"annotation seen by a watch -> notice on the socket: {heard_at - seen_at:.3f} s")

        # The agent leaves the scheduler's annotation as it is, and evicts on the ack.
        assert worker.acknowledge(7) == "accepted"
        eventually(lambda: gone(core, pods.namespace, victim), what="the victim evicted")

        def evicted() -> list[str]:
            return [
                line["reason"]
                for line in agent.log_lines()
                if line.get("event") == "pod_evicted"
                and line.get("pod") == f"{pods.namespace}/{victim}"
            ]

        # The pod can be gone before the agent's line about it is in its log: wait for the line.
        assert eventually(evicted, what="the agent's pod_evicted line") == ["acknowledged"]
        assert time.time() < heard.leave_by.timestamp()  # the scheduler's own time not reached
        eventually(lambda: len(pods.bound(urgent)) == 1, what="the urgent gang bound")
    finally:
        clock.stop()
        worker.close()
        agent.stop()
