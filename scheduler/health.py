"""``/healthz``, ``/readyz`` and ``/metrics`` on a small aiohttp server (embedded with AppRunner).

``/healthz`` fails when the scheduling loop has died or stopped cycling; ``/readyz`` fails until
every informer has listed once (and, with leader election, reports leader, standby, or a leader
that is not writing because it cannot be sure of its Lease — all ready); ``/metrics`` is the
instance's Prometheus registry.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

Probe = Callable[[], tuple[bool, str]]


def app(healthy: Probe, ready: Probe, registry: CollectorRegistry) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        ok, text = healthy()
        return web.Response(status=200 if ok else 503, text=text + "\n")

    async def readyz(_: web.Request) -> web.Response:
        ok, text = ready()
        return web.Response(status=200 if ok else 503, text=text + "\n")

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    application = web.Application()
    application.router.add_get("/healthz", healthz)
    application.router.add_get("/readyz", readyz)
    application.router.add_get("/metrics", metrics)
    return application


async def serve(
    host: str, port: int, healthy: Probe, ready: Probe, registry: CollectorRegistry
) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner (call ``cleanup()`` to stop) and the bound port."""
    # A probe or scrape in flight at the stop gets 2 s (aiohttp's default, 60 s, would outlast
    # the pod's grace).
    runner = web.AppRunner(app(healthy, ready, registry), access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    addresses = runner.addresses
    bound = int(addresses[0][1]) if addresses else port
    return runner, bound
