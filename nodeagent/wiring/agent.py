"""The agent: the rooms, wired, and the guarded background tasks that run them.

Each piece of state has one room (one job each):

- :class:`~nodeagent.wiring.intake.Intake`: what the providers report, into the store; with each
  channel's read health (:class:`~nodeagent.wiring.channels.Channels`);
- :class:`~nodeagent.wiring.pods.PodList`: this node's pods (listed, then watched), the pod file,
  the state restored at start, and the scheduler's reclaims written on them (into the intake);
- :class:`~nodeagent.wiring.board.NoticeBoard`: what the workers see over the notice socket (the
  gRPC service, :attr:`Agent.service`, calls it; the reconcile loop tells through it, to the
  open watches the service keeps; the agent creates all three);
- :class:`~nodeagent.wiring.executor.Executor`: the store's actions carried out through the API,
  off the event loop (:class:`~nodeagent.adapters.calls.ApiCalls`), one at a time per node or pod;
- :class:`~nodeagent.wiring.drain.DrainWatch`: when the node has drained;
- :class:`~nodeagent.wiring.reconcile.Reconciler`: the reconcile loop;
- :class:`~nodeagent.wiring.reports.Reports`: ``/healthz``, ``/readyz`` and ``/status``;
- :class:`~nodeagent.wiring.progress.ProgressWriter`: the workers' progress reports (over the
  notice socket), written on their pods at most once per pod per minute, on an API thread of
  its own;
- the GPU monitor, when enabled (topology, allocation, XID health, GPU-fault notices), whose
  topology :class:`~nodeagent.wiring.topology.TopologyWriter` puts on the node.

The pure core they hold is :class:`~nodeagent.core.store.Store`. Guarded background tasks
(:class:`~nodeagent.wiring.guard.Guard`: a crash is logged and the task restarted, never lost): each
provider's watch, the pod list and watch, the reconcile loop, and the GPU monitor.

Workers hear their notice over gRPC *before* any API write, and the reconcile loop never waits on
the API server: each call runs on a thread pool of its own with a time limit, in the background,
one at a time per node or pod, so an unreachable API server delays writes but never a notice, an
acknowledgement or ``/healthz``. A restarted agent knows its pods from the file before the API
server answers; until it has read the node annotation and listed the pods again it only talks to
the workers and writes nothing.

Everything optional (the pod file, the webhook, the GPU monitor) is an argument; an agent is
complete once constructed, and :meth:`Agent.start` starts it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from nodeagent.adapters.calls import ApiCalls
from nodeagent.adapters.follow import WatchSettings
from nodeagent.adapters.gpu.monitor import GpuMonitor, GpuOptions
from nodeagent.adapters.metrics import Metrics
from nodeagent.adapters.podcache import PodCache
from nodeagent.adapters.webhook import Webhook
from nodeagent.core.events import Pod
from nodeagent.core.ports import ClusterPort, Feed, Provider
from nodeagent.core.store import Settings, Store
from nodeagent.notify.server import NoticeService, Watches
from nodeagent.wiring.board import NoticeBoard
from nodeagent.wiring.channels import Channels
from nodeagent.wiring.drain import DrainWatch
from nodeagent.wiring.executor import Executor
from nodeagent.wiring.guard import Guard
from nodeagent.wiring.intake import Intake
from nodeagent.wiring.pods import PodList
from nodeagent.wiring.progress import ProgressWriter
from nodeagent.wiring.reconcile import Reconciler
from nodeagent.wiring.reports import Reports
from nodeagent.wiring.topology import TopologyWriter

__all__ = ["Agent", "AgentSettings", "ClusterPort"]


@dataclass(frozen=True, slots=True)
class AgentSettings:
    store: Settings = field(default_factory=Settings)
    #: Grace period of the last-resort delete.
    delete_grace_seconds: int = 3
    #: Pod list refresh when idle, and while a notice is live (without a pod feed).
    pods_every: float = 5.0
    pods_every_under_notice: float = 1.0
    #: With a pod feed: how the pods are watched (nodeagent/adapters/follow.py).
    watch: WatchSettings = field(default_factory=WatchSettings)
    #: After a failed action, retry this much later.
    retry_after: float = 1.0
    #: Each API call (an action may make a few requests) gives up after this long, and at most
    #: this many run at once (writes; pod lists and the node read have a thread of their own).
    api_timeout: float = 60.0
    api_concurrency: int = 4
    #: A worker naming a pod not in the list waits this long for a fresh list at most.
    identify_timeout: float = 5.0


def wall_clock() -> datetime:
    return datetime.now(UTC)


class Agent:
    """The rooms of one node's agent, wired. ``pod_cache`` is the pod file, ``webhook`` is told
    of notices and drains, ``gpu`` enables the GPU monitor, ``pod_feed`` watches the pods (else
    they are listed every few seconds); each is off when None."""

    def __init__(
        self,
        cluster: ClusterPort,
        providers: Sequence[Provider],
        *,
        node_name: str,
        settings: AgentSettings | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], datetime] = wall_clock,
        pod_cache: PodCache | None = None,
        webhook: Webhook | None = None,
        gpu: GpuOptions | None = None,
        pod_feed: Feed[Pod] | None = None,
    ) -> None:
        s = settings or AgentSettings()
        woken = asyncio.Event()
        wake = woken.set
        self.metrics = m = metrics or Metrics()
        self.store = store = Store(s.store)
        self.providers = tuple(providers)
        self.webhook = webhook
        self._calls = calls = ApiCalls(timeout=s.api_timeout, concurrency=s.api_concurrency)
        channels = Channels(m)
        self.intake = Intake(
            store, channels, m, node_name=node_name, clock=clock, wake=wake, webhook=webhook
        )
        self.pods = PodList(
            store,
            cluster,
            calls,
            clock=clock,
            wake=wake,
            pod_file=pod_cache,
            every=s.pods_every,
            every_under_notice=s.pods_every_under_notice,
            retry_after=s.retry_after,
            feed=pod_feed,
            watch=s.watch,
            reclaims=self.intake.reclaims,
        )
        watches = Watches()
        self.board = NoticeBoard(
            store,
            self.pods,
            m,
            watches=watches,
            wake=wake,
            identify_timeout=s.identify_timeout,
        )
        self._progress_calls = ApiCalls(timeout=s.api_timeout, concurrency=1)
        self.progress = ProgressWriter(store, cluster, self._progress_calls, m)
        #: The ``shoal.v1.Notices`` service (serve it with :func:`nodeagent.notify.server.serve`).
        self.service = NoticeService(
            self.board, watches=watches, progress=self.progress, wall=lambda: clock().timestamp()
        )
        self.executor, self.reconciler = self._reconcile(cluster, s, woken, node_name, clock)
        topology = TopologyWriter(cluster, calls)
        self.gpu = None if gpu is None else self._gpu(gpu, topology, clock)
        self.guard = Guard()
        self.reports = self._reports(cluster, channels, node_name)

    def _reconcile(
        self,
        cluster: ClusterPort,
        s: AgentSettings,
        woken: asyncio.Event,
        node_name: str,
        clock: Callable[[], datetime],
    ) -> tuple[Executor, Reconciler]:
        """The reconcile loop, the executor it starts writes on, and its drain detection."""
        executor = Executor(
            self.store,
            cluster,
            self._calls,
            board=self.board,
            providers=self.providers,
            metrics=self.metrics,
            clock=clock,
            wake=woken.set,
            retry_after=s.retry_after,
            delete_grace_seconds=s.delete_grace_seconds,
        )
        drains = DrainWatch(
            self.store,
            self.metrics,
            node_name=node_name,
            webhook=self.webhook,
        )
        reconciler = Reconciler(
            self.store, self.board, executor, drains, self.pods, woken=woken, clock=clock
        )
        return executor, reconciler

    def _reports(self, cluster: ClusterPort, channels: Channels, node_name: str) -> Reports:
        return Reports(
            node_name=node_name,
            providers=[p.name for p in self.providers],
            cluster=cluster,
            store=self.store,
            channels=channels,
            pods=self.pods,
            board=self.board,
            executor=self.executor,
            reconciler=self.reconciler,
            guard=self.guard,
            gpu=self.gpu,
            metrics=self.metrics,
        )

    def _gpu(
        self, options: GpuOptions, topology: TopologyWriter, clock: Callable[[], datetime]
    ) -> GpuMonitor:
        """The GPU monitor: a failed GPU is a notice (channel ``gpu``) for the pods holding it."""
        return GpuMonitor(
            topology.publish,
            options.policy,
            owners=options.owners,
            owners_every=options.owners_every,
            on_faults=functools.partial(self.intake.observed, "gpu"),
            fault_lead=options.fault_lead,
            clock=clock,
            absent_retry=options.absent_retry,
            error_retry=options.error_retry,
        )

    def start(self) -> None:
        """Start the guarded tasks (on the running event loop)."""
        self.pods.load_file()
        for provider in self.providers:
            watch = functools.partial(provider.watch, self.intake.sink(provider))
            self.guard.run(f"provider-{provider.name}", watch)
        self.guard.run("pods", self.pods.run)
        self.guard.run("reconcile", self.reconciler.run)
        self.guard.run("progress", self.progress.run)
        if self.gpu is not None:
            self.guard.run("gpu", self.gpu.run)

    async def stop(self) -> None:
        await self.guard.stop()
        await self.executor.stop()
        await self.pods.stop()
        self._calls.close()
        self._progress_calls.close()
        for provider in self.providers:
            await provider.aclose()
        if self.webhook is not None:
            await self.webhook.aclose()
