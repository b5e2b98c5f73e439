"""HTTP endpoints (aiohttp, embedded with ``AppRunner``): /healthz, /readyz, /metrics, /status."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from nodeagent.agent import Agent

AGENT = web.AppKey("agent", Agent)


def _answer(ok: bool, detail: dict[str, Any]) -> web.Response:
    return web.json_response({"ok": ok, **detail}, status=200 if ok else 503)


async def _healthz(request: web.Request) -> web.Response:
    return _answer(*request.app[AGENT].live())


async def _readyz(request: web.Request) -> web.Response:
    return _answer(*request.app[AGENT].ready())


async def _status(request: web.Request) -> web.Response:
    return web.json_response(request.app[AGENT].status())


async def _metrics(request: web.Request) -> web.Response:
    agent = request.app[AGENT]
    agent.metrics.watchers.set(agent.service.watchers())
    body = generate_latest(agent.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def app(agent: Agent) -> web.Application:
    application = web.Application()
    application[AGENT] = agent
    application.router.add_get("/healthz", _healthz)
    application.router.add_get("/readyz", _readyz)
    application.router.add_get("/status", _status)
    application.router.add_get("/metrics", _metrics)
    return application


async def serve(agent: Agent, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start the endpoints; returns the runner (to clean up) and the bound port."""
    runner = web.AppRunner(app(agent), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = port
    for address in runner.addresses:
        bound = int(address[1])
    return runner, bound
