"""Parsing and session helpers used by more than one cloud."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from contracts.times import in_range
from nodeagent.adapters.providers.base import BadBody, BadStatus, Http, Response, Unreachable
from nodeagent.core.events import parse_rfc3339


def digest(*parts: str) -> str:
    """A short stable id for a notice that has none of its own (its content is its identity)."""
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]


def json_body(resp: Response, where: str) -> Any:
    """The body as JSON; garbage, truncation and HTML error pages are a :class:`BadBody`."""
    kind = resp.headers.get("Content-Type", "")
    if kind.startswith("text/html"):
        raise BadBody(f"{where}: an HTML page ({kind}), not metadata")
    try:
        return json.loads(resp.body)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise BadBody(f"{where}: not JSON: {resp.body[:80]!r}") from exc


def plain_body(resp: Response, where: str) -> str:
    kind = resp.headers.get("Content-Type", "")
    if kind.startswith("text/html"):
        raise BadBody(f"{where}: an HTML page ({kind}), not metadata")
    return resp.body.strip()


def rfc3339_field(value: object, where: str) -> datetime:
    if not isinstance(value, str):
        raise BadBody(f"{where}: expected an RFC 3339 time, got {value!r}")
    try:
        return parse_rfc3339(value)
    except ValueError as exc:
        raise BadBody(f"{where}: expected an RFC 3339 time, got {value!r}: {exc}") from exc


def http_date_field(value: object, where: str) -> datetime:
    """Times such as ``Mon, 19 Sep 2016 18:29:47 GMT`` or ``1 Jan 2020 01:03:47 GMT``."""
    if not isinstance(value, str) or not value.strip():
        raise BadBody(f"{where}: expected a date, got {value!r}")
    try:
        parsed = parsedate_to_datetime(value.strip())
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return in_range(parsed.astimezone(UTC), value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise BadBody(f"{where}: expected a date, got {value!r}: {exc}") from exc


def unexpected(resp: Response, where: str) -> BadStatus:
    return BadStatus(f"{where}: HTTP {resp.status}", resp.status)


@dataclass(slots=True)
class SessionToken:
    """The IMDSv2-style session token that AWS (and Alibaba's hardened mode) use.

    ``PUT <path>`` with the TTL header returns a token that every read then carries. The token is
    refreshed before it expires (a quarter of its TTL, at most a minute, ahead); a 401 on a read
    drops it and authenticates again once. When the token call is refused (403/404/405) or gets
    no answer (a hop limit of 1 seen from a pod), reads go on without a token (IMDSv1) and the
    token is tried again a minute later.
    """

    http: Http
    path: str
    ttl_header: str
    token_header: str
    ttl: int = 21600
    monotonic: Callable[[], float] = time.monotonic
    _token: str | None = field(default=None, init=False)
    _expires: float = field(default=0.0, init=False)
    _plain_until: float = field(default=0.0, init=False)
    #: Concurrent reads share one token request.
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)

    @property
    def mode(self) -> str:
        return "token" if self._token is not None else "plain"

    async def _headers(self) -> dict[str, str]:
        async with self._lock:
            return await self._headers_locked()

    async def _headers_locked(self) -> dict[str, str]:
        now = self.monotonic()
        if self._token is not None and now < self._expires:
            return {self.token_header: self._token}
        self._token = None
        if now < self._plain_until:
            return {}
        try:
            resp = await self.http.request(
                "PUT", self.path, headers={self.ttl_header: str(self.ttl)}
            )
        except Unreachable:
            self._plain_until = now + 60.0
            return {}
        if resp.status in (403, 404, 405):
            self._plain_until = now + 60.0
            return {}
        if resp.status != 200 or not resp.body.strip():
            raise BadStatus(f"PUT {self.path}: HTTP {resp.status}", resp.status)
        try:
            ttl = int(resp.headers.get(self.ttl_header, self.ttl))
        except ValueError:
            ttl = self.ttl
        ttl = max(1, min(ttl, self.ttl))
        self._token = resp.body.strip()
        self._expires = now + ttl - min(60.0, ttl / 4)
        return {self.token_header: self._token}

    async def get(self, path: str) -> Response:
        sent = await self._headers()
        resp = await self.http.request("GET", path, headers=sent)
        if resp.status == 401:
            # Expired or revoked token, or an IMDSv2-only machine read without one. Concurrent
            # reads that failed with the same token renew it once.
            async with self._lock:
                if self._token is None or self._token == sent.get(self.token_header):
                    self._token = None
                    self._plain_until = 0.0
            resp = await self.http.request("GET", path, headers=await self._headers())
        return resp
