"""The web view's HTTP side (aiohttp): one page, its script and style, ``/state`` and
``/events``; read-only.

``GET /`` is the page (``static/``, package data: no build step, nothing loaded from elsewhere,
a Content-Security-Policy that allows only this origin), ``GET /state`` the document as JSON,
``GET /events`` the same document as server-sent events, sent again when it changed, at most
every ``interval`` seconds and only while a page listens. Every other method, on any path, is
405.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from importlib import resources

import structlog
from aiohttp import web

from scheduler.web.feed import Feed

log = structlog.get_logger("scheduler")

#: The files the page is made of, and their types.
FILES = {
    "/": ("index.html", "text/html"),
    "/app.js": ("app.js", "text/javascript"),
    "/app.css": ("app.css", "text/css"),
}
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
ALLOW = "GET, HEAD"
#: A comment line now and then keeps idle connections (and proxies) open.
KEEPALIVE_SECONDS = 15.0


class Publisher:
    """Builds the document off the event loop when the feed moved, at most every
    ``interval`` seconds, and hands it to every open ``/events`` stream."""

    def __init__(self, feed: Feed, interval: float) -> None:
        self.feed = feed
        self.interval = interval
        self.latest: bytes | None = None
        self._seen = -1
        self._streams: set[asyncio.Queue[bytes]] = set()
        #: One build at a time (``Feed.document`` compares each snapshot with the one before).
        self._building = asyncio.Lock()

    async def run(self) -> None:
        """Refresh while a page listens; a document that takes long to build is built less
        often (at most a fifth of the time goes to building), so a large cluster's view never
        competes with the loop for long."""
        while True:
            took = 0.0
            if self._streams:
                started = time.perf_counter()
                try:
                    await self.refresh()
                except Exception:  # a bad document must not end the view
                    log.exception("web_view_failed")
                took = time.perf_counter() - started
            await asyncio.sleep(max(self.interval, 4 * took))

    async def refresh(self) -> None:
        """Build the document again if the feed moved since the last one."""
        async with self._building:
            version = self.feed.version
            if version == self._seen:
                return
            doc = await asyncio.to_thread(self.feed.document)
            self._seen = version
            if doc is None:
                return
            self.latest = json.dumps(doc, separators=(",", ":")).encode()
        for queue in self._streams:
            _offer(queue, self.latest)

    def subscribe(self) -> asyncio.Queue[bytes]:
        queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=1)
        if self.latest is not None:
            queue.put_nowait(self.latest)
        self._streams.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[bytes]) -> None:
        self._streams.discard(queue)


def _offer(queue: asyncio.Queue[bytes], body: bytes) -> None:
    """Only the newest document waits for a slow reader."""
    if queue.full():
        queue.get_nowait()
    queue.put_nowait(body)


PUBLISHER = web.AppKey("publisher", Publisher)


async def _page(request: web.Request) -> web.Response:
    name, kind = FILES[request.path]
    body = resources.files("scheduler.web").joinpath("static", name).read_bytes()
    return web.Response(body=body, content_type=kind, charset="utf-8", headers=HEADERS)


async def _state(request: web.Request) -> web.Response:
    publisher = request.app[PUBLISHER]
    await publisher.refresh()
    body = publisher.latest or b"null"
    return web.Response(body=body, content_type="application/json", headers=HEADERS)


async def _events(request: web.Request) -> web.StreamResponse:
    publisher = request.app[PUBLISHER]
    response = web.StreamResponse(headers={**HEADERS, "Content-Type": "text/event-stream"})
    await response.prepare(request)
    await publisher.refresh()  # nothing is built while no page listens
    queue = publisher.subscribe()
    try:
        while True:
            try:
                async with asyncio.timeout(KEEPALIVE_SECONDS):
                    body = await queue.get()
            except TimeoutError:
                await response.write(b": keepalive\n\n")
                continue
            await response.write(b"event: state\ndata: " + body + b"\n\n")
    except ConnectionResetError:
        return response
    finally:
        publisher.unsubscribe(queue)


async def _other(request: web.Request) -> web.Response:
    """Any other path is 404 to a read; every write, on any path, is 405."""
    if request.method in ("GET", "HEAD"):
        raise web.HTTPNotFound(headers=HEADERS)
    raise web.HTTPMethodNotAllowed(request.method, ["GET", "HEAD"], headers=HEADERS)


def app(publisher: Publisher) -> web.Application:
    application = web.Application()
    application[PUBLISHER] = publisher
    for path in FILES:
        application.router.add_get(path, _page)
    application.router.add_get("/state", _state)
    application.router.add_get("/events", _events)
    application.router.add_route("*", "/{tail:.*}", _other)
    return application


@dataclass(frozen=True, slots=True)
class Serving:
    """A started web view: where it listens, and how to stop it."""

    runner: web.AppRunner
    task: asyncio.Task[None]
    port: int

    async def close(self) -> None:
        self.task.cancel()
        await self.runner.cleanup()


async def serve(host: str, port: int, feed: Feed, *, interval: float = 0.5) -> Serving:
    """Start serving ``feed`` at ``host``:``port`` (0: any free port)."""
    publisher = Publisher(feed, interval)
    runner = web.AppRunner(app(publisher), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    addresses = runner.addresses
    bound = int(addresses[0][1]) if addresses else port
    task = asyncio.create_task(publisher.run(), name="web-view")
    return Serving(runner, task, bound)
