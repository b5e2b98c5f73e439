"""The program: wire settings, API client, cache, informers, loop, HTTP server; run until signalled.

Threads: one per informer, the scheduling loop, the bind workers and the status writers. The
asyncio loop in the main thread serves HTTP and waits for SIGTERM/SIGINT, then stops everything
in order (informers, loop, in-flight bindings).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading

import structlog

from scheduler import health
from scheduler.cache import Cache
from scheduler.cycle import Config
from scheduler.k8s.client import TokenBucket, api_client
from scheduler.k8s.lease import LeaderElector
from scheduler.k8s.status import ApiBinder, ApiReporter
from scheduler.k8s.view import ClusterView
from scheduler.metrics import Metrics
from scheduler.runner import Runner, Settings
from scheduler.settings import CliSettings

log = structlog.get_logger("scheduler")


def configure_logging(fmt: str) -> None:
    console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if console else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )


def run(settings: CliSettings) -> int:
    configure_logging(settings.log_format)
    workers = max(1, int(settings.bind_workers))
    try:
        api = api_client(settings.kubeconfig, pool_size=workers + 16)
    except Exception as exc:
        where = settings.kubeconfig or "in-cluster config"
        print(f"python -m scheduler: cannot load {where}: {exc}", file=sys.stderr)
        return 2
    limiter = TokenBucket(float(settings.qps), int(settings.burst))
    cache = Cache()
    metrics = Metrics()
    name = str(settings.scheduler_name)
    # Events and conditions get their own budget (as kube-scheduler's event client does), so
    # telling users about a decision never slows down carrying it out.
    reporter = ApiReporter(api, TokenBucket(float(settings.qps), int(settings.burst)), name)
    metrics.status_backlog.set_function(lambda: reporter.backlog)
    runner = Runner(
        cache,
        ApiBinder(api, limiter),
        reporter,
        Settings(
            scheduler_name=name,
            bind_workers=workers,
            config=Config(
                topology_keys=tuple(settings.topology_keys), reclaim=bool(settings.reclaim)
            ),
            max_backoff=float(settings.max_backoff),
            reclaim_grace=float(settings.reclaim_grace),
        ),
        metrics,
    )
    view = ClusterView(api, cache, lambda freed: runner.wake(freed=freed))
    elector: LeaderElector | None = None
    if settings.leader_elect:
        elector = LeaderElector(
            api,
            namespace=str(settings.lease_namespace),
            name=str(settings.lease_name or name),
            on_change=lambda _: runner.wake(freed=True),
        )

    def may_schedule() -> bool:
        return view.synced() and (elector is None or elector.is_leader())

    stop = threading.Event()
    loop = threading.Thread(target=runner.run, args=(stop, may_schedule), name="schedule")

    def healthy() -> tuple[bool, str]:
        if not loop.is_alive():
            return False, "scheduling loop is not running"
        return True, "ok"

    def ready() -> tuple[bool, str]:
        missing = [i.kind for i in view.informers if not i.synced.is_set()]
        if missing:
            return False, f"caches not synced: {', '.join(missing)}"
        if elector is not None:
            return True, "leader" if elector.is_leader() else "standby"
        return True, "ok"

    view.start()
    if elector is not None:
        elector.start()
    loop.start()
    log.info(
        "started",
        scheduler=name,
        qps=settings.qps,
        burst=settings.burst,
        bind_workers=workers,
        leader_elect=bool(settings.leader_elect),
    )
    try:
        asyncio.run(_serve(settings, healthy, ready, metrics))
    finally:
        stop.set()
        runner.wake()
        view.stop()
        if elector is not None:
            elector.stop()
        loop.join(timeout=10)
        runner.close()
        reporter.close()
        api.close()
        log.info("stopped", scheduler=name)
    return 0


async def _serve(
    settings: CliSettings, healthy: health.Probe, ready: health.Probe, metrics: Metrics
) -> None:
    http, port = await health.serve(
        str(settings.http_host), int(settings.http_port), healthy, ready, metrics.registry
    )
    log.info("http_serving", host=settings.http_host, port=port)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    try:
        while not done.is_set():
            try:
                await asyncio.wait_for(done.wait(), timeout=5)
            except TimeoutError:
                ok, text = healthy()
                if not ok:
                    log.error("unhealthy", reason=text)
    finally:
        await http.cleanup()
