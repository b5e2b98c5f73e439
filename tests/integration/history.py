"""Every version of a namespace's objects of one kind, as a watch delivered them, for what a
test checks about states that come and go: an annotation that lasts until its pod is evicted,
how few members of a gang were bound at the lowest, the phases a PodGroup went through. A poll
sees only the states it happens to land on; the watch delivers each change, so the record kept
here is complete and read after the fact."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import watch

from tests.waiting import eventually

#: The objects at one moment, by name.
State = dict[str, Any]


def _meta(obj: Any, field: str) -> str:
    """A metadata field of a model object (typed kinds) or a dict (custom objects)."""
    if isinstance(obj, dict):
        return str(obj["metadata"][field])
    return str(getattr(obj.metadata, "resource_version" if field == "resourceVersion" else field))


class History:
    """Lists with ``list_fn(*args)``, then watches from that listing: ``states()`` is the
    listing and the state after each change since, in the order the API server made them."""

    def __init__(self, list_fn: Callable[..., Any], *args: Any) -> None:
        self._list = list_fn
        self._args = args
        self._lock = threading.Lock()
        listing = list_fn(*args)
        items = listing["items"] if isinstance(listing, dict) else listing.items
        self._current: State = {_meta(o, "name"): o for o in items}
        self._states: list[State] = [dict(self._current)]
        self._times: list[float] = [time.monotonic()]  # when each state was received
        self._failed: BaseException | None = None
        self._watch = watch.Watch()
        version = (
            listing["metadata"]["resourceVersion"]
            if isinstance(listing, dict)
            else listing.metadata.resource_version
        )
        self._thread = threading.Thread(target=self._run, args=(version,), daemon=True)
        self._thread.start()

    def _run(self, version: str) -> None:
        try:
            for event in self._watch.stream(self._list, *self._args, resource_version=version):
                obj = event["object"]
                with self._lock:
                    if event["type"] == "DELETED":
                        self._current.pop(_meta(obj, "name"), None)
                    elif event["type"] in ("ADDED", "MODIFIED"):
                        self._current[_meta(obj, "name")] = obj
                    else:
                        continue
                    self._states.append(dict(self._current))
                    self._times.append(time.monotonic())
        except BaseException as exc:  # a gap in the record must fail the test, not hide
            with self._lock:
                self._failed = exc

    def states(self) -> list[State]:
        """Every state recorded so far; fails the test if the watch broke (the record would
        have a gap)."""
        return self._record()[0]

    def _record(self) -> tuple[list[State], list[float]]:
        with self._lock:
            if self._failed is not None:
                raise AssertionError(f"the watch broke: {self._failed!r}")
            return list(self._states), list(self._times)

    def versions(self, name: str) -> list[Any]:
        """Every version of the object ``name`` recorded, oldest first, without repeats."""
        found: list[Any] = []
        for state in self.states():
            obj = state.get(name)
            if obj is not None and (
                not found or _meta(found[-1], "resourceVersion") != _meta(obj, "resourceVersion")
            ):
                found.append(obj)
        return found

    def when(self, name: str, holds: Callable[[Any], bool]) -> float | None:
        """When (``time.monotonic()``) this process received the first version of the object
        ``name`` for which ``holds`` is true; None if none so far."""
        for state, at in zip(*self._record(), strict=True):
            obj = state.get(name)
            if obj is not None and holds(obj):
                return at
        return None

    def lowest(self, count: Callable[[State], int], *, since: Callable[[State], bool]) -> int:
        """The smallest ``count`` of the states recorded from the first for which ``since``
        holds, once the record has caught up with the API server."""
        self.caught_up()
        states = self.states()
        first = next((i for i, state in enumerate(states) if since(state)), None)
        assert first is not None, "no state recorded matches since"
        return min(count(state) for state in states[first:])

    def caught_up(self, timeout: float = 60) -> None:
        """Wait until the latest recorded state is the objects as listed now."""

        def same() -> bool:
            listing = self._list(*self._args)
            items = listing["items"] if isinstance(listing, dict) else listing.items
            listed = {_meta(o, "name"): _meta(o, "resourceVersion") for o in items}
            latest = self.states()[-1]
            return listed == {n: _meta(o, "resourceVersion") for n, o in latest.items()}

        eventually(same, timeout=timeout, what="the watch to catch up with a listing")

    def close(self) -> None:
        self._watch.stop()
