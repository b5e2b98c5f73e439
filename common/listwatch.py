"""List, then watch: the one loop both programs follow the API server with (a client-go
reflector's, kopf's).

List and hand the whole set over; watch from the list's resourceVersion, each change handed over
as it comes and its version remembered (a bookmark's too); when a watch ends, watch again from
the newest version seen; on ``410 Gone`` (that version was compacted away) list again at once.
Any other failure is told (:class:`Hooks`) and retried after a backoff from
:attr:`Policy.retry_after` doubling up to :attr:`Policy.max_backoff`, resuming where it broke,
so a flaky API server never stops a program and nothing is lost while no watch is open. A kind
the API server does not serve (``Hooks.absent``) is asked for again every ``max_backoff``.

The loop is written once, without I/O (:func:`steps`: a generator of :class:`List`,
:class:`Watch` and :class:`Wait` steps, told of each step's failure by ``throw``), and driven
by the caller's transport through two small drivers: :func:`run_blocking` on a thread of its
own (the scheduler's informers, on the official client) and :func:`run_async` on an event loop,
each watch read on a daemon thread (the node agent, on its own small urllib3 transport). The
transports only list, and yield each change of one watch; raw watch lines are read by
:func:`decode`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import threading
import time
from collections.abc import Awaitable, Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar


class Gone(Exception):
    """The version a watch started from is too old (HTTP 410 Gone): list again."""


class WatchError(Exception):
    """The API server ended a watch with an ``ERROR`` event other than ``410 Gone``."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One line of a watch: ``type`` (ADDED, MODIFIED, DELETED, BOOKMARK), the raw object, and
    its resourceVersion (empty when it had none)."""

    type: str
    object: dict[str, Any]
    version: str


def decode(line: bytes | str | Mapping[str, Any]) -> WatchEvent:
    """One watch line (raw JSON, or already decoded) as an event. Raises :class:`Gone` for a
    410 ``ERROR`` event and :class:`WatchError` (its message, cut to 300 characters) for
    another."""
    event = line if isinstance(line, Mapping) else json.loads(line)
    kind = str(event.get("type") or "")
    obj = event.get("object") or {}
    if kind == "ERROR":
        if obj.get("code") == 410:
            raise Gone(str(obj.get("message") or "410 Gone"))
        raise WatchError(str(obj.get("message") or obj)[:300])
    version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return WatchEvent(kind, obj, version)


@dataclass(frozen=True, slots=True)
class Policy:
    """How often the loop lists and watches, and how it waits after a failure."""

    #: Each watch is ended by the server after this long times a draw from 1 to ``watch_spread``
    #: (above 1, a fleet's watches do not come back in step).
    watch_timeout: int = 300
    watch_spread: float = 1.0
    #: A watch that ends is preceded by a list once this long has passed since the last one.
    relist_every: float = math.inf
    #: After a failed list or watch, wait this long, doubling up to ``max_backoff``; each wait is
    #: drawn between ``jitter`` times it and all of it (1.0: exactly).
    retry_after: float = 0.5
    max_backoff: float = 10.0
    jitter: float = 1.0


@dataclass(slots=True)
class Cursor:
    """Where the loop stands: the version to watch from, whether a watch is open, why the last
    list or watch failed (until one is answered again), and when the last whole list was."""

    version: str = ""
    watching: bool = False
    error: str | None = None
    listed_at: float = -math.inf

    def listed(self, version: str, now: float) -> None:
        """A whole list at ``version`` was applied at ``now``: the next watch starts from it."""
        self.version = version
        self.listed_at = now
        self.error = None

    def seen(self, version: str) -> None:
        """A watch answered (with a change at ``version``, or empty when it only opened)."""
        if version:
            self.version = version
        self.error = None


def _nothing(_exc: Exception) -> None:
    return None


def _served(_exc: Exception) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class Hooks:
    """What the loop tells its owner: a watch ``expired`` (410, a list follows), a list or watch
    ``failed`` (a backoff follows), and whether a failure means the kind is ``absent`` (not
    served: the owner treats it as empty; it is listed again after ``max_backoff``)."""

    expired: Callable[[Exception], None] = _nothing
    failed: Callable[[Exception], None] = _nothing
    absent: Callable[[Exception], bool] = _served


@dataclass(frozen=True, slots=True)
class List:
    """List the whole set; the owner hands its version to :meth:`Cursor.listed`."""


@dataclass(frozen=True, slots=True)
class Watch:
    """Watch from ``version`` until the server ends it after ``timeout`` seconds."""

    version: str
    timeout: int


@dataclass(frozen=True, slots=True)
class Wait:
    seconds: float


Step = List | Watch | Wait


def steps(
    cursor: Cursor,
    policy: Policy,
    hooks: Hooks,
    *,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
) -> Generator[Step, None, None]:
    """The loop, forever: each step for the driver to carry out; a step that failed is thrown
    back in. Lists first unless ``cursor`` was listed less than ``relist_every`` ago."""
    draw = rng or random.Random()  # noqa: S311 (jitter, not secrets)
    backoff = policy.retry_after
    relist = False
    while True:
        listing = False
        try:
            if relist or clock() - cursor.listed_at >= policy.relist_every:
                listing = True
                yield List()
                listing, relist = False, False
            timeout = round(policy.watch_timeout * draw.uniform(1.0, policy.watch_spread))
            cursor.watching = True
            try:
                yield Watch(cursor.version, timeout)
            finally:
                cursor.watching = False
            backoff, cursor.error = policy.retry_after, None
        except Exception as exc:
            if isinstance(exc, Gone) and not listing:
                hooks.expired(exc)
                relist = True
                continue
            if hooks.absent(exc):
                relist = True
                yield Wait(policy.max_backoff)
                continue
            cursor.error = str(exc) or type(exc).__name__
            hooks.failed(exc)
            yield Wait(backoff * draw.uniform(policy.jitter, 1.0))
            backoff = min(backoff * 2, policy.max_backoff)


class Versioned(Protocol):
    @property
    def version(self) -> str: ...


E = TypeVar("E", bound=Versioned)


def run_blocking(
    loop: Generator[Step, None, None],
    cursor: Cursor,
    *,
    relist: Callable[[], None],
    watch: Callable[[str, int], Iterator[E]],
    changed: Callable[[E], None],
    stop: threading.Event,
) -> None:
    """Carry out ``loop`` on this thread until ``stop`` is set: ``relist`` lists (and tells
    ``cursor``), ``watch`` yields each change of one watch, which goes to ``changed``."""
    step = next(loop)
    while not stop.is_set():
        try:
            if isinstance(step, Wait):
                stop.wait(step.seconds)
            elif isinstance(step, List):
                relist()
            else:
                for change in watch(step.version, step.timeout):
                    if stop.is_set():
                        return
                    cursor.seen(change.version)
                    changed(change)
        except Exception as exc:
            if stop.is_set():
                return
            step = loop.throw(exc)
        else:
            step = next(loop)


@dataclass(slots=True)
class AsyncWatch:
    """What :func:`run_async` needs of a transport: ``watch`` blocks (it is read on a daemon
    thread of its own, so a blocked read never holds up an exit) and ``stop_watch`` ends the
    watch under way from another thread."""

    watch: Callable[[str, int], Iterator[Any]]
    stop_watch: Callable[[], None]
    #: Names the watch's thread.
    name: str = "watch"
    #: Set by :meth:`stop`: the watch's thread hands nothing more over.
    stopping: bool = field(default=False, init=False)

    def stop(self) -> None:
        """End the watch under way; changes still on their way are dropped."""
        self.stopping = True
        self.stop_watch()


async def run_async(
    loop: Generator[Step, None, None],
    cursor: Cursor,
    *,
    relist: Callable[[], Awaitable[None]],
    source: AsyncWatch,
    changed: Callable[[Any], None],
) -> None:
    """Carry out ``loop`` on the running event loop until cancelled: ``relist`` lists (and
    tells ``cursor``); each watch's changes, then its end, are handed to the event loop in
    order, each to ``changed`` after ``cursor`` has seen it."""
    step = next(loop)
    while True:
        try:
            if isinstance(step, Wait):
                await asyncio.sleep(step.seconds)
            elif isinstance(step, List):
                await relist()
            else:
                await _WatchThread(source, cursor, changed).run(step)
        except Exception as exc:
            step = loop.throw(exc)
        else:
            step = next(loop)


class _WatchThread:
    """One watch, read on a daemon thread; its changes, then its end, are handed to the event
    loop in order."""

    def __init__(self, source: AsyncWatch, cursor: Cursor, changed: Callable[[Any], None]) -> None:
        self._source = source
        self._cursor = cursor
        self._changed = changed
        self._events = asyncio.get_running_loop()
        self._ended: asyncio.Future[None] = self._events.create_future()

    async def run(self, step: Watch) -> None:
        thread = threading.Thread(
            target=self._follow, args=(step,), name=self._source.name, daemon=True
        )
        thread.start()
        try:
            await self._ended
        except asyncio.CancelledError:
            self._source.stop_watch()
            raise

    def _hand(self, call: Callable[[Any], None], arg: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop closed: the program stopped
            self._events.call_soon_threadsafe(call, arg)

    def _change(self, item: Versioned) -> None:
        self._cursor.seen(item.version)
        self._changed(item)

    def _end(self, error: BaseException | None) -> None:
        if self._ended.done():
            return
        if error is None:
            self._ended.set_result(None)
        else:
            self._ended.set_exception(error)

    def _follow(self, step: Watch) -> None:
        try:
            for item in self._source.watch(step.version, step.timeout):
                if self._source.stopping:
                    break
                self._hand(self._change, item)
        except Exception as exc:
            self._hand(self._end, exc)
        else:
            self._hand(self._end, None)
