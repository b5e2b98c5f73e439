"""The providers' error tree (its root, :class:`~nodeagent.core.ports.ProviderError`, and the
:class:`~nodeagent.core.ports.Provider` protocol are in the core's ports), and the HTTP and
polling plumbing they share.

Errors: every fault a metadata server can produce becomes a :class:`ProviderError` (with the
original exception chained), is reported to the :class:`Sink` and counted, and the watch goes
on at the next tick. A provider never raises out of :meth:`Provider.watch`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import aiohttp
import structlog
from multidict import CIMultiDict

from nodeagent.core.events import Notice
from nodeagent.core.ports import ProviderError, Sink

log = structlog.get_logger("nodeagent.adapters.providers")

Clock = Callable[[], datetime]


def wall_clock() -> datetime:
    return datetime.now(UTC)


class Unreachable(ProviderError):
    """No answer: connection refused or reset, or no answer within the timeout."""

    kind = "unreachable"


class BadStatus(ProviderError):
    """An HTTP status the protocol does not allow at this point."""

    kind = "status"

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class BadBody(ProviderError):
    """The body is not what the protocol documents (garbage, truncated, wrong type)."""

    kind = "body"


class TooLarge(BadBody):
    """The body is larger than any real answer could be; it is not read to the end."""

    kind = "too-large"


@dataclass(frozen=True, slots=True)
class HttpSettings:
    """Where and how often to read. Every wait is ``interval * uniform(1 - jitter, 1)``, so
    consecutive reads never start more than ``interval`` apart and hosts do not poll in step."""

    base_url: str
    timeout: float = 2.0
    interval: float = 1.0
    jitter: float = 0.4
    max_body: int = 64 * 1024

    def with_base(self, base_url: str | None) -> HttpSettings:
        if not base_url:
            return self
        return HttpSettings(
            base_url=base_url,
            timeout=self.timeout,
            interval=self.interval,
            jitter=self.jitter,
            max_body=self.max_body,
        )


@dataclass(frozen=True, slots=True)
class Response:
    """An answer read to the end. Header names are case-insensitive."""

    status: int
    headers: Mapping[str, str]
    body: str


#: Told of each answer: sent and received on the local clock (seconds since the epoch) and the
#: answer's ``Date`` header (see :mod:`nodeagent.wiring.clock`).
DateProbe = Callable[[float, float, str | None], None]


@dataclass(slots=True)
class Http:
    """A small HTTP client for metadata servers: bounded time, bounded body, typed faults.
    ``on_date`` is told of every answer's ``Date`` header (the metadata server's clock)."""

    settings: HttpSettings
    local: Callable[[], float] = time.time
    on_date: DateProbe | None = None
    _session: aiohttp.ClientSession | None = field(default=None, init=False)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # Metadata servers are link-local: never through a proxy, never with cookies.
            self._session = aiohttp.ClientSession(
                trust_env=False, cookie_jar=aiohttp.DummyCookieJar()
            )
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
        data: str | None = None,
        time_limit: float | None = None,
    ) -> Response:
        url = self.settings.base_url.rstrip("/") + path
        limit = self.settings.max_body
        seconds = self.settings.timeout if time_limit is None else time_limit
        sent = self.local()
        try:
            async with self._client().request(
                method,
                url,
                headers=dict(headers or {}),
                params=dict(params or {}),
                data=data,
                timeout=aiohttp.ClientTimeout(total=seconds),
                allow_redirects=False,
            ) as resp:
                if self.on_date is not None:
                    self.on_date(sent, self.local(), resp.headers.get("Date"))
                if resp.content_length is not None and resp.content_length > limit:
                    raise TooLarge(f"{method} {path}: {resp.content_length} bytes > {limit}")
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_chunked(16 * 1024):
                    size += len(chunk)
                    if size > limit:
                        raise TooLarge(f"{method} {path}: body larger than {limit} bytes")
                    chunks.append(chunk)
                try:
                    body = b"".join(chunks).decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise BadBody(f"{method} {path}: body is not UTF-8") from exc
                return Response(status=resp.status, headers=CIMultiDict(resp.headers), body=body)
        except TimeoutError as exc:
            raise Unreachable(f"{method} {path}: no answer within {seconds:g} s") from exc
        except aiohttp.ClientError as exc:
            raise Unreachable(f"{method} {path}: {exc.__class__.__name__}: {exc}") from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def next_wait(settings: HttpSettings, rng: random.Random) -> float:
    return settings.interval * (1.0 - settings.jitter * rng.random())


async def report(sink: Sink, channel: str, read: Callable[[], Awaitable[Sequence[Notice]]]) -> bool:
    """Read one channel and report the outcome; True when the read succeeded."""
    try:
        notices = await read()
    except ProviderError as exc:
        sink.failed(channel, exc)
        return False
    except Exception as exc:  # a bug in a parser must not end the watch
        log.exception("provider_crashed", channel=channel)
        error = ProviderError(f"{exc.__class__.__name__}: {exc}")
        error.__cause__ = exc
        sink.failed(channel, error)
        return False
    sink.observed(channel, notices)
    return True


async def poll_forever(
    settings: HttpSettings, rng: random.Random, tick: Callable[[], Awaitable[None]]
) -> None:
    """Run ``tick`` every ``next_wait`` seconds, measured from the start of the previous tick."""
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        await tick()
        await asyncio.sleep(max(0.0, started + next_wait(settings, rng) - loop.time()))


def bounded(stated: datetime, now: datetime, max_lead: timedelta, **context: str) -> datetime:
    """A stated deadline, capped at ``now + max_lead`` (a far-future time is not believed: the
    cloud's documented lead time is the most the agent may count on). Past times stand: the
    notice is simply overdue."""
    latest = now + max_lead
    if stated > latest:
        log.warning(
            "deadline_capped", stated=stated.isoformat(), deadline=latest.isoformat(), **context
        )
        return latest
    return stated
