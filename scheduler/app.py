"""The program: wire settings, API client, cache, informers, loop, HTTP server; run until signalled.

Threads: one per informer, the scheduling loop, the bind workers and the status writers. The
asyncio loop in the main thread serves HTTP and waits for SIGTERM/SIGINT, then stops everything
in order (informers, loop, in-flight bindings).
"""

from __future__ import annotations

import asyncio
import functools
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from common import logs
from common.leave import stop_asked, stop_on_signal
from scheduler import health
from scheduler.cache import Cache
from scheduler.cycle import Config
from scheduler.k8s.client import FencedApi, KubeconfigError, TokenBucket, api_client
from scheduler.k8s.lease import LeaderElector
from scheduler.k8s.risk_store import RiskKeeper, RiskStore, read_seed
from scheduler.k8s.status import ApiBinder, ApiReporter
from scheduler.k8s.view import ClusterView
from scheduler.k8s.webhook_config import PodEvents
from scheduler.loss import ProgressCost
from scheduler.metrics import Metrics
from scheduler.placement.risk import Pool, RiskLedger
from scheduler.placement.shapes import ShapeLedger
from scheduler.runner import Runner, Settings
from scheduler.settings import CliSettings, SettingsError, split_address
from scheduler.web import server as web_view
from scheduler.web.feed import Feed, Tee
from scheduler.webhook import serving

log = structlog.get_logger("scheduler")


def run(settings: CliSettings) -> int:
    """Wire the scheduler, start it, serve HTTP until signalled, then stop it in order.

    Exit status 2 when the kubeconfig cannot be loaded, 0 after an orderly stop.
    """
    logs.configure(str(settings.log_format))
    workers = max(1, int(settings.bind_workers))
    try:
        api = api_client(settings.kubeconfig, pool_size=workers + 16)
    except KubeconfigError as exc:
        # Names the file and where in it, never a value (kubeconfigs hold tokens and keys).
        print(f"python -m scheduler: cannot load {exc}", file=sys.stderr)
        return 2
    try:
        program = _wire(settings, api, workers)
    except SettingsError as exc:
        print(f"python -m scheduler: {exc}", file=sys.stderr)
        return 2
    program.start()
    log.info(
        "started",
        scheduler=program.name,
        qps=settings.qps,
        burst=settings.burst,
        bind_workers=workers,
        leader_elect=bool(settings.leader_elect),
    )
    try:
        asyncio.run(_serve(settings, program))
    finally:
        program.shutdown()
        log.info("stopped", scheduler=program.name)
    return 0


@dataclass(frozen=True, slots=True)
class _Program:
    """The wired parts of a scheduler process: what starts, what the probes ask, what stops."""

    name: str
    #: The kubernetes ApiClient (typed loosely: only ``scheduler.k8s`` imports kubernetes).
    api: Any
    metrics: Metrics
    reporter: ApiReporter
    runner: Runner
    view: ClusterView
    #: Warning Events on new pods the webhook could not wire in full.
    wiring_events: PodEvents
    elector: LeaderElector | None
    stop: threading.Event
    loop: threading.Thread
    stall_timeout: float
    #: What the web view shows (``--web-view``); ``None`` when it is off.
    feed: Feed | None = None
    #: Writes the learned revocation counts (``--capacity-risk``); ``None`` when it is off.
    risk: RiskKeeper | None = None

    def start(self) -> None:
        """Informers first, then the lease, then the scheduling loop that waits for both."""
        self.view.start()
        if self.elector is not None:
            self.elector.start()
        if self.risk is not None:
            self.risk.start()
        self.loop.start()

    def shutdown(self) -> None:
        """Stop watching, let the loop finish its cycle and in-flight bindings, then close."""
        self.stop.set()
        self.runner.wake()
        self.view.stop()
        self.loop.join(timeout=10)
        self.view.join(timeout=5)
        if self.risk is not None:
            self.risk.stop()  # its last write, while this replica still leads
        if self.elector is not None:
            self.elector.stop()
        self.runner.close()
        self.reporter.close()
        self.wiring_events.close()
        self.api.close()

    def healthy(self) -> tuple[bool, str]:
        """Live while the loop thread runs and a cycle completed within the stall timeout."""
        if not self.loop.is_alive():
            return False, "scheduling loop is not running"
        stalled = self.runner.stalled(self.stall_timeout)
        if stalled is not None:
            return False, stalled
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        """Ready once every informer has listed; says whether this replica leads, and whether a
        leader is fenced (scheduler/k8s/lease.py)."""
        missing = [i.kind for i in self.view.informers if not i.synced.is_set()]
        if missing:
            return False, f"caches not synced: {', '.join(missing)}"
        if self.elector is not None:
            why = self.elector.refusal()
            if why is None:
                return True, "leader"
            # A leader that cannot be sure of its Lease writes nothing until it renews (or exits).
            return True, f"leader, not writing: {why}" if self.elector.leading else "standby"
        return True, "ok"


def _wire(settings: CliSettings, api: Any, workers: int) -> _Program:
    """Build the cache, reporter, runner, informers, lease and loop thread, not yet started."""
    limiter = TokenBucket(float(settings.qps), int(settings.burst))
    cache = Cache(topology_keys=tuple(settings.topology_keys))
    metrics = Metrics()
    name = str(settings.scheduler_name)
    # A change of leader wakes the loop (the runner is built below; the elector starts after).
    elector = _elector(settings, api, name, lambda _: runner.wake(freed=True))
    # Binds, evictions, conditions, Events and PodGroup status leave only while this replica
    # holds the Lease by its own clock (scheduler/k8s/lease.py), checked as each one leaves.
    writes = api if elector is None else FencedApi(api, elector.refusal)
    # Events and conditions get their own budget (as kube-scheduler's event client does), so
    # telling users about a decision never slows down carrying it out.
    # PodGroup status and Events go in the version of each kind its informer found served
    # (the view is built below, hence the lambda).
    reporter = ApiReporter(
        writes,
        TokenBucket(float(settings.qps), int(settings.burst)),
        name,
        served=lambda kind: view.served(kind),  # noqa: PLW0108
    )
    metrics.status_backlog.set_function(lambda: reporter.backlog)
    binder = ApiBinder(writes, limiter, cache.has_node)
    feed = Feed(name) if settings.web_view else None
    ledger, keeper = _capacity_risk(settings, api, name, lambda: _may_schedule(view, elector))
    runner = Runner(
        cache,
        binder,
        reporter if feed is None else Tee(reporter, feed),
        _runner_settings(settings, name, workers, ledger),
        metrics,
        observe=None if feed is None else feed.observe,
    )
    wiring_events = PodEvents(api, name)
    view = ClusterView(
        api,
        cache,
        lambda freed: runner.wake(freed=freed),
        pod_added=wiring_events.pod_added,
        resize_blocked=reporter.resize_blocked,
    )
    stop = threading.Event()
    may_schedule = functools.partial(_may_schedule, view, elector)
    loop = threading.Thread(target=runner.run, args=(stop, may_schedule), name="schedule")
    return _Program(
        name=name,
        api=api,
        metrics=metrics,
        reporter=reporter,
        runner=runner,
        view=view,
        wiring_events=wiring_events,
        elector=elector,
        stop=stop,
        loop=loop,
        stall_timeout=float(settings.stall_timeout),
        feed=feed,
        risk=keeper,
    )


def _capacity_risk(
    settings: CliSettings, api: Any, name: str, may_write: Callable[[], bool]
) -> tuple[RiskLedger | None, RiskKeeper | None]:
    """The revocation-rate ledger, read from its ConfigMap and the operator's table, and the
    thread that keeps it there; none with ``--capacity-risk=false``."""
    if not settings.capacity_risk:
        return None, None
    seed: dict[Pool, float] = {}
    if settings.capacity_risk_seed:
        path = str(settings.capacity_risk_seed)
        try:
            with open(path, encoding="utf-8") as f:
                seed = read_seed(f.read(), path)
        except (OSError, ValueError) as exc:
            raise SettingsError(f"--capacity-risk-seed: {exc}") from exc
    ledger = RiskLedger(window=float(settings.capacity_risk_window))
    store = RiskStore(
        api,
        str(settings.lease_namespace),
        str(settings.capacity_risk_configmap or f"{name}-capacity-risk"),
    )
    keeper = RiskKeeper(
        store,
        ledger,
        seed=seed,
        interval=float(settings.capacity_risk_write_interval),
        may_write=may_write,
    )
    keeper.load()
    return ledger, keeper


def _runner_settings(
    settings: CliSettings, name: str, workers: int, risk: RiskLedger | None = None
) -> Settings:
    """The loop's settings, taken from the command line."""
    return Settings(
        scheduler_name=name,
        bind_workers=workers,
        config=Config(
            topology_keys=tuple(settings.topology_keys),
            reclaim=bool(settings.reclaim),
            victim_cost=ProgressCost(float(settings.reclaim_restart_seconds)),
            risk=risk,
            shapes=ShapeLedger() if settings.arrived_shapes else None,
        ),
        max_backoff=float(settings.max_backoff),
        reclaim_grace=float(settings.reclaim_grace),
        torn_grace=float(settings.torn_grace),
        early_warning_wait=float(settings.early_warning_wait),
        class_patience=dict(settings.reclaim_patience),
    )


def _elector(
    settings: CliSettings, api: Any, name: str, on_change: Callable[[bool], None]
) -> LeaderElector | None:
    """A lease elector when leader election is on, with the Lease's timings."""
    if not settings.leader_elect:
        return None
    return LeaderElector(
        api,
        namespace=str(settings.lease_namespace),
        name=str(settings.lease_name or name),
        on_change=on_change,
        lease_duration=int(settings.leader_elect_lease_duration),
        renew_deadline=float(settings.leader_elect_renew_deadline),
        retry_period=float(settings.leader_elect_retry_period),
    )


def _may_schedule(view: ClusterView, elector: LeaderElector | None) -> bool:
    """Decide only on caches that have listed, and only while leading (or alone): asked at the
    start of every cycle, and false from the moment this replica cannot be sure it holds the
    Lease (a paused leader wakes up fenced)."""
    return view.synced() and (elector is None or elector.is_leader())


async def _serve(settings: CliSettings, program: _Program) -> None:
    healthy = program.healthy
    http, port = await health.serve(
        str(settings.http_host),
        int(settings.http_port),
        healthy,
        program.ready,
        program.metrics.registry,
    )
    log.info("http_serving", host=settings.http_host, port=port)
    webhook = await _start_webhook(settings, program.api)
    view = await _start_web_view(settings, program.feed)
    done = asyncio.Event()
    if stop_asked():
        log.info("stop_heard_while_starting", scheduler=program.name)
    stop_on_signal(asyncio.get_running_loop(), done.set)
    try:
        while not done.is_set():
            try:
                async with asyncio.timeout(5):
                    await done.wait()
            except TimeoutError:
                ok, text = healthy()
                if not ok:
                    log.error("unhealthy", reason=text)
                if webhook is not None:
                    await webhook.tend()
    finally:
        if view is not None:
            await view.close()
        if webhook is not None:
            await webhook.close()
        await http.cleanup()


async def _start_web_view(settings: CliSettings, feed: Feed | None) -> web_view.Serving | None:
    """The read-only web view when asked for; one that cannot start is logged and left out."""
    if feed is None:
        return None
    host, port = split_address(str(settings.web_view))
    try:
        view = await web_view.serve(host, port, feed)
    except OSError as exc:
        log.error("web_view_not_started", error=str(exc), address=settings.web_view)
        return None
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{view.port}/"
    log.info("web_view_serving", host=host, port=view.port, url=url)
    return view


async def _start_webhook(settings: CliSettings, api: Any) -> serving.Webhook | None:
    """The admission webhook when asked for; one that cannot start is logged and left out
    (its configuration's failurePolicy Ignore admits pods unwired), never the scheduler."""
    if not settings.webhook:
        return None
    try:
        return await serving.start(settings, api)
    except (OSError, ValueError) as exc:
        log.error("webhook_not_started", error=str(exc), port=settings.webhook_port)
        return None
