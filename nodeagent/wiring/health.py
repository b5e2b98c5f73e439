"""HTTP endpoints (aiohttp, embedded with ``AppRunner``): /healthz, /readyz, /metrics, /status.

What they serve comes from :class:`Endpoints` (the agent's
:class:`nodeagent.wiring.reports.Reports`)
and, for /healthz and /readyz, :class:`NoticeSocket` (whether new workers can connect); this
module only speaks HTTP and decides who may see pod names.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from nodeagent.adapters.metrics import Metrics
from nodeagent.core.ports import NoticeSocket


class Endpoints(Protocol):
    """What the endpoints serve."""

    @property
    def metrics(self) -> Metrics: ...

    def watchers(self) -> int:
        """Open watches on the notice socket (read into the gauge before each scrape)."""

    def live(self) -> tuple[bool, dict[str, Any]]:
        """``/healthz``."""

    def ready(self) -> tuple[bool, dict[str, Any]]:
        """``/readyz``."""

    def status(self) -> dict[str, Any]:
        """``/status``, with every pod name (hidden here from callers off the node)."""


ENDPOINTS = web.AppKey[Endpoints]("endpoints")
SOCKET = web.AppKey[NoticeSocket | None]("notice_socket")
STATUS_PODS = web.AppKey("status_pods", bool)


def _answer(ok: bool, detail: dict[str, Any]) -> web.Response:
    return web.json_response({"ok": ok, **detail}, status=200 if ok else 503)


def _with_socket(request: web.Request, ok: bool, detail: dict[str, Any]) -> web.Response:
    """An agent no new worker can reach is neither live nor ready: a restart serves the socket
    again (its folder mounted anew)."""
    notice_socket = request.app[SOCKET]
    if notice_socket is not None:
        socket_ok, socket_detail = notice_socket.live()
        ok = ok and socket_ok
        detail = {**detail, "notice_socket": socket_detail}
    return _answer(ok, detail)


async def _healthz(request: web.Request) -> web.Response:
    return _with_socket(request, *request.app[ENDPOINTS].live())


async def _readyz(request: web.Request) -> web.Response:
    return _with_socket(request, *request.app[ENDPOINTS].ready())


def _from_loopback(request: web.Request) -> bool:
    try:
        peer = ipaddress.ip_address(request.remote or "")
    except ValueError:
        return False  # a unix socket or an unknown peer: not known to be this machine
    if isinstance(peer, ipaddress.IPv6Address) and peer.ipv4_mapped is not None:
        peer = peer.ipv4_mapped
    return peer.is_loopback


HIDDEN = "ask from loopback, or start the agent with --status-pods"


def _without_pods(report: dict[str, Any]) -> dict[str, Any]:
    """``/status`` less every pod name (the pods, the pods a notice is for, who holds each
    GPU): counts instead."""
    shown = dict(report)
    shown["pods"] = {"hidden": HIDDEN, "count": len(report.get("pods") or [])}
    shown["notices"] = [
        {**n, "scope": {"hidden": HIDDEN, "count": len(n["scope"])}}
        if isinstance(n.get("scope"), list)
        else n
        for n in report.get("notices") or []
    ]
    gpu = report.get("gpu")
    if isinstance(gpu, dict) and isinstance(gpu.get("allocated"), dict):
        shown["gpu"] = {**gpu, "allocated": {"hidden": HIDDEN, "count": len(gpu["allocated"])}}
    return shown


async def _status(request: web.Request) -> web.Response:
    report = request.app[ENDPOINTS].status()
    if not (request.app[STATUS_PODS] or _from_loopback(request)):
        # Which pods run here, and what they were told, is for the node's own operators
        # (kubectl port-forward and exec arrive on loopback), not for the pod network.
        report = _without_pods(report)
    return web.json_response(report)


async def _metrics(request: web.Request) -> web.Response:
    endpoints = request.app[ENDPOINTS]
    endpoints.metrics.watchers.set(endpoints.watchers())
    body = generate_latest(endpoints.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def app(
    endpoints: Endpoints, *, status_pods: bool = False, notice_socket: NoticeSocket | None = None
) -> web.Application:
    application = web.Application()
    application[ENDPOINTS] = endpoints
    application[SOCKET] = notice_socket
    application[STATUS_PODS] = status_pods
    application.router.add_get("/healthz", _healthz)
    application.router.add_get("/readyz", _readyz)
    application.router.add_get("/status", _status)
    application.router.add_get("/metrics", _metrics)
    return application


async def serve(
    endpoints: Endpoints,
    host: str,
    port: int,
    *,
    status_pods: bool = False,
    notice_socket: NoticeSocket | None = None,
) -> tuple[web.AppRunner, int]:
    """Start the endpoints; returns the runner (to clean up) and the bound port. ``/status``
    lists the pods to loopback callers only, unless ``status_pods``; ``/healthz`` and
    ``/readyz`` fail while ``notice_socket`` cannot be served."""
    application = app(endpoints, status_pods=status_pods, notice_socket=notice_socket)
    # A probe or scrape in flight at the stop gets 2 s (aiohttp's default, 60 s, would outlast
    # the pod's grace).
    runner = web.AppRunner(application, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = port
    for address in runner.addresses:
        bound = int(address[1])
    return runner, bound
