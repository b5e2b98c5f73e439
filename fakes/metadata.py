"""Fake AWS, GCP, Azure and Alibaba metadata servers (aiohttp, loopback, documented protocol).

Each server keeps the state a test sets (``aws.instance_action = {...}``) and answers as the
cloud documents. :class:`Faults` replaces the next answers with a fault. Servers are started with
``await server.start()`` in the test's event loop, or in their own thread with
:class:`Threaded` for synchronous tests (integration tests drive the Kubernetes client).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import secrets
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from aiohttp import web

T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: Faults a test can queue: each replaces one answer (token calls excepted).
#: ``huge``: 10 MB streamed without a Content-Length; ``hang``: never answers (until the server
#: closes); ``wrong-type``: a well-formed spot document served as an HTML page.
FAULTS = (
    "503",
    "500",
    "garbage",
    "oversize",
    "html",
    "truncated-json",
    "slow",
    "huge",
    "hang",
    "wrong-type",
)
HUGE_BYTES = 10 * 1024 * 1024


@dataclass(slots=True)
class Faults:
    queue: deque[str] = field(default_factory=deque)
    #: Every answer waits this long (a slow server).
    delay: float = 0.0
    slow_seconds: float = 5.0
    served: int = 0

    def next(self, *faults: str) -> None:
        for fault in faults:
            if fault not in FAULTS:
                raise ValueError(f"unknown fault {fault!r}; known: {FAULTS}")
            self.queue.append(fault)


def _fault_response(fault: str) -> web.StreamResponse:
    if fault in ("503", "500"):
        return web.Response(status=int(fault), text="Service Unavailable")
    if fault == "garbage":
        return web.Response(body=secrets.token_bytes(64), content_type="application/octet-stream")
    if fault == "oversize":
        return web.Response(text="[" + "0," * 200_000 + "0]", content_type="text/plain")
    if fault == "wrong-type":
        doc = {"action": "terminate", "time": "2026-11-30T10:02:00Z"}
        return web.Response(text=json.dumps(doc), content_type="text/html")
    if fault == "html":
        return web.Response(text="<html><body>proxy error</body></html>", content_type="text/html")
    return web.Response(text='{"action": "termin', content_type="text/plain")


async def _huge(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    chunk = b"0" * (64 * 1024)
    with contextlib.suppress(ConnectionError):
        for _ in range(HUGE_BYTES // len(chunk)):
            await resp.write(chunk)
        await resp.write_eof()
    return resp


class _Server:
    """Shared plumbing: an aiohttp app with the fault middleware, on 127.0.0.1:<free port>."""

    token_path: str | None = None

    def __init__(self) -> None:
        self.faults = Faults()
        self.requests: list[tuple[str, str]] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        if self.faults.delay:
            await asyncio.sleep(self.faults.delay)
        if request.path != self.token_path and self.faults.queue:
            fault = self.faults.queue.popleft()
            self.faults.served += 1
            if fault == "slow":
                await asyncio.sleep(self.faults.slow_seconds)
            elif fault == "hang":
                await asyncio.Event().wait()
            elif fault == "huge":
                return await _huge(request)
            else:
                return _fault_response(fault)
        return await handler(request)

    async def start(self) -> None:
        app = web.Application(middlewares=[self._middleware])
        self.routes(app)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.Server)
        self.port = server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


_AWS_TIME = "%Y-%m-%dT%H:%M:%SZ"


class AwsMetadata(_Server):
    """EC2 IMDS: IMDSv2 session tokens (v1 allowed unless ``v2_only``), the spot, rebalance and
    scheduled-maintenance documents. ``None`` / empty means 404."""

    token_path = "/latest/api/token"  # noqa: S105 - a URL path, not a secret

    def __init__(
        self, *, v2_only: bool = False, token_api: bool = True, restamp: bool = False
    ) -> None:
        super().__init__()
        self.v2_only = v2_only
        self.token_api = token_api
        #: Re-stamp the documents on every read, as AWS's own metadata mock does by default:
        #: the spot action's time becomes "now + 2 min", the rebalance noticeTime "now".
        self.restamp = restamp
        self.instance_action: dict[str, str] | None = None
        self.rebalance: dict[str, str] | None = None
        self.maintenance: list[dict[str, str]] = []
        #: ``autoscaling/target-lifecycle-state`` (plain text); None: not in an Auto Scaling
        #: group (404).
        self.lifecycle_state: str | None = None
        self.tokens: dict[str, float] = {}
        self.token_puts = 0
        self.unauthorized = 0

    def expire_tokens(self) -> None:
        self.tokens = dict.fromkeys(self.tokens, 0.0)

    def routes(self, app: web.Application) -> None:
        app.router.add_put("/latest/api/token", self._token)
        app.router.add_get("/latest/meta-data/{path:.*}", self._get)

    async def _token(self, request: web.Request) -> web.Response:
        if not self.token_api:
            return web.Response(status=403)
        self.token_puts += 1
        raw = request.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
        if not raw.isdecimal() or not 1 <= int(raw) <= 21600:
            return web.Response(status=400)
        token = secrets.token_urlsafe(32)
        self.tokens[token] = time.monotonic() + int(raw)
        return web.Response(text=token, headers={"X-aws-ec2-metadata-token-ttl-seconds": raw})

    def _authorized(self, request: web.Request) -> bool:
        token = request.headers.get("X-aws-ec2-metadata-token")
        if token is not None:
            ok = self.tokens.get(token, 0.0) > time.monotonic()
        else:
            ok = not self.v2_only
        self.unauthorized += not ok
        return ok

    async def _get(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.Response(status=401)
        path = request.match_info["path"]
        if self.restamp:
            self._restamp()
        body: object = None
        if path == "spot/instance-action":
            body = self.instance_action
        elif path == "spot/termination-time":
            if self.instance_action is not None:
                return web.Response(text=self.instance_action["time"])
        elif path == "events/recommendations/rebalance":
            body = self.rebalance
        elif path == "events/maintenance/scheduled":
            body = self.maintenance
        elif path == "autoscaling/target-lifecycle-state" and self.lifecycle_state is not None:
            return web.Response(text=self.lifecycle_state)
        if body is None:
            return web.Response(status=404, text="Not Found")
        # IMDS serves JSON documents as text/plain.
        return web.Response(text=json.dumps(body), content_type="text/plain")

    def _restamp(self) -> None:
        now = datetime.now(UTC)
        if self.instance_action is not None:
            soon = now + timedelta(minutes=2)
            self.instance_action = {**self.instance_action, "time": soon.strftime(_AWS_TIME)}
        if self.rebalance is not None:
            self.rebalance = {**self.rebalance, "noticeTime": now.strftime(_AWS_TIME)}


class GcpMetadata(_Server):
    """GCE metadata: ``Metadata-Flavor: Google`` both ways, ETags, ``wait_for_change``."""

    def __init__(self) -> None:
        super().__init__()
        self.values = {"instance/preempted": "FALSE", "instance/maintenance-event": "NONE"}
        self._generation = itertools.count()
        self._etags = {path: self._etag(path) for path in self.values}
        self._changed: dict[str, asyncio.Event] = {}
        self.long_polls = 0

    def _etag(self, path: str) -> str:
        raw = f"{path}:{self.values[path]}:{next(self._generation)}".encode()
        return hashlib.sha256(raw).hexdigest()[:16]

    def set(self, path: str, value: str) -> None:
        """Change a value (in the server's loop); long-polls waiting on it answer at once."""
        if self.values.get(path) == value:
            return
        self.values[path] = value
        self._etags[path] = self._etag(path)
        event = self._changed.pop(path, None)
        if event is not None:
            event.set()

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/computeMetadata/v1/{path:.*}", self._get)

    async def _get(self, request: web.Request) -> web.Response:
        if request.headers.get("Metadata-Flavor") != "Google":
            return web.Response(status=403, text="Missing Metadata-Flavor:Google header.")
        path = request.match_info["path"]
        if path not in self.values:
            return web.Response(status=404, headers={"Metadata-Flavor": "Google"})
        if request.query.get("wait_for_change") == "true":
            self.long_polls += 1
            last = request.query.get("last_etag")
            if last is None or last == self._etags[path]:
                timeout = float(request.query.get("timeout_sec", "300"))
                event = self._changed.setdefault(path, asyncio.Event())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), timeout)
        return web.Response(
            text=self.values[path],
            content_type="application/text",
            headers={"Metadata-Flavor": "Google", "ETag": self._etags[path]},
        )


class AzureMetadata(_Server):
    """Azure IMDS Scheduled Events: ``Metadata: true``, api-version, ``StartRequests``."""

    def __init__(self, vm_name: str = "vm-0") -> None:
        super().__init__()
        self.vm_name = vm_name
        self.events: list[dict[str, Any]] = []
        self.incarnation = 1
        self.approved: list[str] = []

    def set_events(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.incarnation += 1

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/metadata/scheduledevents", self._get)
        app.router.add_post("/metadata/scheduledevents", self._post)
        app.router.add_get("/metadata/instance/compute/name", self._name)

    @staticmethod
    def _refused(request: web.Request) -> web.Response | None:
        if request.headers.get("Metadata") != "true":
            return web.json_response(
                {"error": "Bad request. Required metadata header not specified"}, status=400
            )
        if "api-version" not in request.query:
            return web.json_response(
                {"error": "Bad request. api-version was not specified"}, status=400
            )
        return None

    async def _name(self, request: web.Request) -> web.Response:
        return self._refused(request) or web.Response(text=self.vm_name)

    async def _get(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        return web.json_response({"DocumentIncarnation": self.incarnation, "Events": self.events})

    async def _post(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        try:
            doc = json.loads(await request.text())
            ids = [str(item["EventId"]) for item in doc["StartRequests"]]
        except (ValueError, KeyError, TypeError):
            return web.Response(status=400, text="malformed StartRequests")
        for event_id in ids:
            if event_id not in self.approved:
                self.approved.append(event_id)
            for event in self.events:
                if event.get("EventId") == event_id:
                    event["EventStatus"] = "Started"
                    event["NotBefore"] = ""
        self.incarnation += 1
        return web.Response(status=200)


class AlibabaMetadata(_Server):
    """ECS metadata: ``instance/spot/termination-time`` (404 = none), optional hardened mode."""

    token_path = "/latest/api/token"  # noqa: S105 - a URL path, not a secret

    def __init__(self, *, hardened: bool = False) -> None:
        super().__init__()
        self.hardened = hardened
        self.termination_time: str | None = None
        self.tokens: dict[str, float] = {}

    def routes(self, app: web.Application) -> None:
        app.router.add_put("/latest/api/token", self._token)
        app.router.add_get("/latest/meta-data/{path:.*}", self._get)

    async def _token(self, request: web.Request) -> web.Response:
        raw = request.headers.get("X-aliyun-ecs-metadata-token-ttl-seconds", "")
        if not raw.isdecimal() or not 1 <= int(raw) <= 21600:
            return web.Response(status=400)
        token = secrets.token_urlsafe(24)
        self.tokens[token] = time.monotonic() + int(raw)
        return web.Response(text=token)

    async def _get(self, request: web.Request) -> web.Response:
        token = request.headers.get("X-aliyun-ecs-metadata-token")
        if (token is None and self.hardened) or (
            token is not None and self.tokens.get(token, 0.0) <= time.monotonic()
        ):
            return web.Response(status=401)
        if request.match_info["path"] != "instance/spot/termination-time":
            return web.Response(status=404)
        if self.termination_time is None:
            return web.Response(status=404, text="Not Found")
        return web.Response(text=self.termination_time, content_type="text/plain")


S = TypeVar("S", bound=_Server)


class Threaded:
    """Runs fake servers on their own event loop thread, for synchronous tests.

    ``call(fn)`` runs ``fn`` in that loop (servers are not thread-safe) and returns its result.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._servers: list[_Server] = []

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout=30)

    def call(self, fn: Callable[[], T]) -> T:
        async def call() -> T:
            return fn()

        return self.run(call())

    def start(self, server: S) -> S:
        self.run(server.start())
        self._servers.append(server)
        return server

    def close(self) -> None:
        for server in self._servers:
            self.run(server.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()
