"""The agent: providers feed the store, the store says what is due, adapters carry it out.

Guarded background tasks (a crash is logged and the task restarted, never lost):

- each provider's watch (the cloud's, and the Kubernetes-side signals), reporting to
  :meth:`Agent.observed` / :meth:`Agent.failed`;
- the pod list of this node, refreshed every few seconds (every second while a notice is live);
- the reconcile loop: restores what the node annotation recorded (a restart mid-notice repeats
  nothing), then, whenever woken or when the store's next moment comes, carries out what is due;
- the GPU monitor, when enabled (topology, allocation, XID health, GPU-fault notices).

Workers hear their notice over gRPC *before* the slower API writes of the same round, so the
time from detection to the workers does not include API latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import structlog

from contracts import gputopology
from contracts.gputopology import GpuTopology
from nodeagent.events import (
    AckUpstream,
    Action,
    DeletePod,
    EventId,
    EvictPod,
    Notice,
    NotifyPod,
    Pod,
    PodKey,
    PodUid,
    SyncNode,
    Tracked,
    WithdrawPod,
    rfc3339,
)
from nodeagent.gpu.monitor import GpuMonitor, Owners
from nodeagent.gpu.xid import XidPolicy
from nodeagent.metrics import Metrics
from nodeagent.notify.server import NoticeService, message
from nodeagent.providers import Provider, ProviderError
from nodeagent.store import AckOutcome, Settings, Store
from nodeagent.webhook import Webhook

log = structlog.get_logger("nodeagent")


class ClusterPort(Protocol):
    """The Kubernetes calls the agent makes (see :class:`nodeagent.k8s.Cluster`); blocking."""

    last_ok: float
    dry_run: bool

    def read_revocation(self) -> list[Tracked]: ...
    def list_pods(self) -> list[Pod]: ...
    def sync_node(self, tracked: Sequence[Tracked]) -> None: ...
    def annotate_pod(self, pod: Pod, notice: Notice) -> bool: ...
    def clear_pod(self, pod: Pod) -> bool: ...
    def evict(self, pod: Pod, reason: str) -> bool: ...
    def delete(self, pod: Pod, grace_seconds: int) -> bool: ...
    def write_topology(self, text: str) -> None: ...


@dataclass(frozen=True, slots=True)
class AgentSettings:
    store: Settings = field(default_factory=Settings)
    #: Grace period of the last-resort delete.
    delete_grace_seconds: int = 3
    #: Pod list refresh when idle, and while a notice is live.
    pods_every: float = 5.0
    pods_every_under_notice: float = 1.0
    #: After a failed action, retry this much later.
    retry_after: float = 1.0


@dataclass(slots=True)
class ChannelHealth:
    provider: str = ""
    stale_after: float = float("inf")
    reads: int = 0
    errors: int = 0
    consecutive_errors: int = 0
    last_ok: float | None = None
    last_ok_wall: datetime | None = None
    last_error: str | None = None
    last_error_kind: str | None = None


def _describe(notice: Notice) -> dict[str, Any]:
    return {
        "event_id": notice.event_id,
        "source": notice.source,
        "notice_kind": notice.kind.value,
        "deadline": rfc3339(notice.deadline),
        "reason": notice.reason,
    }


class _ProviderSink:
    """Reports of one provider, tagged with it (which channel is whose, how stale is too old)."""

    def __init__(self, agent: Agent, provider: Provider) -> None:
        self.agent = agent
        self.provider = provider

    def observed(self, channel: str, notices: Sequence[Notice]) -> None:
        self.agent.observed(channel, notices, self.provider)

    def failed(self, channel: str, error: ProviderError) -> None:
        self.agent.failed(channel, error, self.provider)


def _watch(agent: Agent, provider: Provider) -> Callable[[], Awaitable[None]]:
    return lambda: provider.watch(_ProviderSink(agent, provider))


class Agent:
    def __init__(
        self,
        cluster: ClusterPort,
        providers: Sequence[Provider],
        *,
        node_name: str,
        settings: AgentSettings | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.cluster = cluster
        self.providers = list(providers)
        self.node_name = node_name
        self.settings = settings or AgentSettings()
        self.metrics = metrics or Metrics()
        self.clock = clock
        self.store = Store(self.settings.store)
        self.service = NoticeService(self)
        self.channels: dict[str, ChannelHealth] = {}
        self.restored = False
        self.reconciles = 0
        self.heartbeat = time.monotonic()
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.crashes: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._pods_lock = asyncio.Lock()
        self._pods_at = 0.0
        self._detected: dict[EventId, float] = {}
        self._notified_at: dict[PodUid, float] = {}
        self._drained: set[EventId] = set()
        self.gpu: GpuMonitor | None = None
        self.webhook: Webhook | None = None
        self._published_topology: str | None = None

    def watch_gpus(
        self,
        policy: XidPolicy | None = None,
        owners: Owners | None = None,
        fault_lead: timedelta = timedelta(seconds=30),
    ) -> None:
        """Monitor the GPUs through NVML and publish their topology (and, with ``owners``, which
        pod holds which GPU) on the node; a failed GPU is a notice for the pods holding it."""
        self.gpu = GpuMonitor(
            self.publish_topology,
            policy,
            owners=owners,
            on_faults=lambda notices: self.observed("gpu", notices),
            fault_lead=fault_lead,
            clock=self.clock,
        )

    async def publish_topology(self, topology: GpuTopology) -> None:
        text = gputopology.encode(topology)
        if text != self._published_topology:
            await asyncio.to_thread(self.cluster.write_topology, text)
            self._published_topology = text

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        for provider in self.providers:
            self._guard(f"provider-{provider.name}", _watch(self, provider))
        self._guard("pods", self._pods_loop)
        self._guard("reconcile", self._reconcile_loop)
        if self.gpu is not None:
            self._guard("gpu", self.gpu.run)

    async def stop(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        for provider in self.providers:
            await provider.aclose()
        if self.webhook is not None:
            await self.webhook.aclose()

    def _guard(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        async def guarded() -> None:
            while True:
                try:
                    await run()
                    log.error("task_ended", task=name)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("task_crashed", task=name)
                self.crashes[name] = self.crashes.get(name, 0) + 1
                await asyncio.sleep(1.0)

        self.tasks[name] = asyncio.create_task(guarded(), name=f"nodeagent-{name}")

    def wake(self) -> None:
        self._wake.set()

    # --- provider sink -------------------------------------------------------------------------

    def _channel(self, channel: str, provider: Provider | None) -> ChannelHealth:
        health = self.channels.get(channel)
        if health is None:
            health = ChannelHealth()
            if provider is not None:
                health.provider = provider.name
                health.stale_after = provider.stale_after()
            self.channels[channel] = health
        return health

    def observed(
        self, channel: str, notices: Sequence[Notice], provider: Provider | None = None
    ) -> None:
        health = self._channel(channel, provider)
        if health.consecutive_errors:
            log.info("metadata_recovered", channel=channel, after=health.consecutive_errors)
        health.reads += 1
        health.consecutive_errors = 0
        health.last_ok = time.monotonic()
        health.last_ok_wall = self.clock()
        self.metrics.metadata_reads.labels(channel).inc()
        before = {t.notice.event_id for t in self.store.active()}
        new = self.store.observe(channel, notices, self.clock())
        after = {t.notice.event_id for t in self.store.active()}
        for event_id in new:
            notice = next(t.notice for t in self.store.active() if t.notice.event_id == event_id)
            self._detected[event_id] = time.monotonic()
            self.metrics.notices.labels(notice.source, notice.kind.value).inc()
            self.metrics.lead.observe(max(0.0, (notice.deadline - self.clock()).total_seconds()))
            if self.webhook is not None and notice.disruptive:
                self.webhook.send({"kind": "notice", "node": self.node_name, **_describe(notice)})
            log.warning(
                "notice_detected",
                event_id=event_id,
                source=notice.source,
                kind=notice.kind.value,
                deadline=rfc3339(notice.deadline),
                disruptive=notice.disruptive,
                reason=notice.reason,
            )
        for event_id in before - after:
            self.metrics.withdrawn.inc()
            log.warning("notice_withdrawn", event_id=event_id, channel=channel)
        self.metrics.active.set(len(after))
        if before != after or new:
            self.wake()

    def failed(self, channel: str, error: ProviderError, provider: Provider | None = None) -> None:
        health = self._channel(channel, provider)
        health.errors += 1
        health.consecutive_errors += 1
        health.last_error = str(error)
        health.last_error_kind = error.kind
        self.metrics.metadata_errors.labels(channel, error.kind).inc()
        # One line when a streak starts or changes kind, then every 60th: logs stay readable.
        if health.consecutive_errors == 1 or health.consecutive_errors % 60 == 0:
            log.warning(
                "metadata_error",
                channel=channel,
                kind=error.kind,
                error=str(error),
                consecutive=health.consecutive_errors,
            )

    # --- notice board (gRPC) -------------------------------------------------------------------

    async def identify(self, key: PodKey, uid: PodUid) -> bool:
        pod = self.store.pod(uid)
        # A pod that started a moment ago may not be in the list yet; callers naming unknown
        # pods cannot make the agent list pods more than once a second.
        if pod is None and time.monotonic() - self._pods_at > 1.0:
            await self.refresh_pods()
            pod = self.store.pod(uid)
        return pod is not None and pod.key == key

    def notice_for(self, uid: PodUid) -> Notice | None:
        return self.store.pod_notice(uid)

    def watching(self, uid: PodUid) -> None:
        self.store.mark_worker(uid)
        self.metrics.watchers.set(self.service.watchers() + 1)

    async def acknowledge(self, key: PodKey, uid: PodUid, step: int) -> AckOutcome:
        outcome = self.store.acknowledge(key, uid, step)
        if outcome is AckOutcome.ACCEPTED:
            told = self._notified_at.get(uid)
            if told is not None:
                self.metrics.ack.observe(time.monotonic() - told)
            self.wake()
        return outcome

    # --- pods ----------------------------------------------------------------------------------

    async def refresh_pods(self) -> None:
        async with self._pods_lock:
            pods = await asyncio.to_thread(self.cluster.list_pods)
            self.store.set_pods(pods)
            self._pods_at = time.monotonic()
        self.wake()

    async def _pods_loop(self) -> None:
        while True:
            try:
                await self.refresh_pods()
            except Exception as exc:
                log.warning("pods_unreadable", error=str(exc))
            live = any(t.notice.disruptive for t in self.store.active())
            s = self.settings
            await asyncio.sleep(s.pods_every_under_notice if live else s.pods_every)

    # --- reconcile -----------------------------------------------------------------------------

    async def _restore(self) -> None:
        while not self.restored:
            try:
                tracked = await asyncio.to_thread(self.cluster.read_revocation)
                self.store.restore(tracked)
                await self.refresh_pods()
            except Exception as exc:
                log.warning("restore_failed", error=str(exc))
                await asyncio.sleep(self.settings.retry_after)
                continue
            self.restored = True
            if tracked:
                log.warning("notices_restored", event_ids=[t.notice.event_id for t in tracked])

    async def _reconcile_loop(self) -> None:
        await self._restore()
        while True:
            self.heartbeat = time.monotonic()
            failed = await self.reconcile()
            self.reconciles += 1
            now = self.clock()
            wait = self.settings.retry_after if failed else 5.0
            moment = self.store.next_change(now)
            if moment is not None:
                wait = min(wait, max(0.0, (moment - now).total_seconds()) + 0.01)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)
            self._wake.clear()

    async def reconcile(self) -> bool:
        """Carry out everything due now (a few rounds: notify, then evict at once if late).
        Returns True when some action failed."""
        failed = False
        for _round in range(4):
            actions = self.store.due(self.clock())
            if not actions:
                break
            # Workers first: the gRPC notices go out before any API write of this round.
            for action in actions:
                if isinstance(action, NotifyPod):
                    self._tell(action.pod.uid, action.notice)
            for action in actions:
                ok = await self._execute(action)
                self.store.record(action, ok=ok, now=self.clock())
                self.metrics.actions.labels(type(action).__name__, "ok" if ok else "failed").inc()
                failed = failed or not ok
            if failed:
                break
        self._check_drained()
        return failed

    def _tell(self, uid: PodUid, notice: Notice) -> None:
        reached = self.service.publish(uid, message(notice))
        self.store.heard(uid, notice)
        now = time.monotonic()
        self._notified_at.setdefault(uid, now)
        detected = self._detected.get(notice.event_id)
        if reached and detected is not None:
            self.metrics.notify.observe(now - detected)

    async def _execute(self, action: Action) -> bool:
        try:
            match action:
                case SyncNode(notices=notices):
                    await asyncio.to_thread(self.cluster.sync_node, notices)
                    return True
                case NotifyPod(pod=pod, notice=notice):
                    # False means the pod is gone: nothing left to tell.
                    await asyncio.to_thread(self.cluster.annotate_pod, pod, notice)
                    return True
                case WithdrawPod(pod=pod):
                    self.service.publish(pod.uid, message(None, withdrawn=True))
                    self._notified_at.pop(pod.uid, None)
                    await asyncio.to_thread(self.cluster.clear_pod, pod)
                    return True
                case EvictPod(pod=pod, why=why):
                    return await asyncio.to_thread(self.cluster.evict, pod, why)
                case DeletePod(pod=pod):
                    grace = self.settings.delete_grace_seconds
                    return await asyncio.to_thread(self.cluster.delete, pod, grace)
                case AckUpstream(notice=notice):
                    if self.cluster.dry_run:
                        log.info("upstream_ack_skipped", event_id=notice.event_id, dry_run=True)
                        return True
                    for provider in self.providers:
                        if provider.name == notice.source:
                            await provider.acknowledge(notice)
                    return True
        except Exception as exc:
            log.warning("action_failed", action=type(action).__name__, error=str(exc))
            return False

    def _check_drained(self) -> None:
        governing = self.store.governing()
        if governing is None or governing.event_id in self._drained:
            return
        if self.store.pods_out():
            self._drained.add(governing.event_id)
            detected = self._detected.get(governing.event_id)
            if detected is not None:
                self.metrics.drain.observe(time.monotonic() - detected)
            log.warning("node_drained", event_id=governing.event_id)
            if self.webhook is not None:
                self.webhook.send(
                    {"kind": "drained", "node": self.node_name, **_describe(governing)}
                )

    # --- reports -------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "node": self.node_name,
            "providers": [p.name for p in self.providers],
            "dry_run": self.cluster.dry_run,
            "restored": self.restored,
            "reconciles": self.reconciles,
            "notices": [
                {
                    "event_id": t.notice.event_id,
                    "source": t.notice.source,
                    "channel": t.notice.channel,
                    "kind": t.notice.kind.value,
                    "deadline": rfc3339(t.notice.deadline),
                    "disruptive": t.notice.disruptive,
                    "reason": t.notice.reason,
                    "scope": sorted(t.notice.scope) if t.notice.scope is not None else "node",
                    "first_seen": rfc3339(t.first_seen),
                    "upstream_acked": t.upstream_acked,
                }
                for t in self.store.active()
            ],
            "pods": self.store.pod_report(),
            "watchers": self.service.watchers(),
            "channels": {
                name: {
                    "reads": h.reads,
                    "errors": h.errors,
                    "consecutive_errors": h.consecutive_errors,
                    "last_ok": rfc3339(h.last_ok_wall) if h.last_ok_wall else None,
                    "seconds_since_ok": None if h.last_ok is None else round(now - h.last_ok, 3),
                    "last_error": h.last_error,
                    "last_error_kind": h.last_error_kind,
                }
                for name, h in sorted(self.channels.items())
            },
            "api_seconds_since_ok": (
                None if not self.cluster.last_ok else round(now - self.cluster.last_ok, 3)
            ),
            "gpu": self.gpu.report() if self.gpu is not None else {"state": "disabled"},
            "task_crashes": dict(self.crashes),
        }

    def live(self) -> tuple[bool, dict[str, Any]]:
        """``/healthz``: the loop turns and every background task is running."""
        dead = [name for name, task in self.tasks.items() if task.done()]
        age = time.monotonic() - self.heartbeat
        ok = not dead and age < 30.0
        return ok, {"tasks_dead": dead, "reconcile_seconds_ago": round(age, 3)}

    def ready(self) -> tuple[bool, dict[str, Any]]:
        """``/readyz``: metadata read recently, the API server answered recently, state restored."""
        now = time.monotonic()
        metadata: dict[str, str] = {}
        for provider in self.providers:
            if provider.name == "none":
                metadata["none"] = "disabled"
            elif not any(h.provider == provider.name for h in self.channels.values()):
                metadata[provider.name] = "no read yet"
        for name, h in self.channels.items():
            if h.last_ok is None:
                metadata[name] = f"never read: {h.last_error}"
            elif now - h.last_ok > h.stale_after:
                metadata[name] = f"no read for {now - h.last_ok:.0f} s: {h.last_error}"
            else:
                metadata[name] = "ok"
        api_age = now - self.cluster.last_ok if self.cluster.last_ok else None
        api_ok = api_age is not None and api_age < 30.0
        ok = all(v in ("ok", "disabled") for v in metadata.values()) and api_ok and self.restored
        return ok, {
            "metadata": metadata,
            "api_server": "ok" if api_ok else "unreachable",
            "restored": self.restored,
            # No GPU or no driver is a state of the node, not a reason to stop serving.
            "gpu": self.gpu.state if self.gpu is not None else "disabled",
            # Which pod holds which GPU (the kubelet's PodResources socket): without it, GPU
            # faults reach no pod, but nothing else is held up.
            "gpu_allocation": self.gpu.allocation if self.gpu is not None else "disabled",
        }
