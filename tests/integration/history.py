"""Every version of a namespace's pods, as a watch delivered them, for what a test checks about
states that come and go: an annotation that lasts until its pod is evicted, how few members of a
gang were bound at the lowest. A poll sees only the states it happens to land on; the watch
delivers each change, so the record kept here is complete and read after the fact."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from kubernetes import watch

from tests.waiting import eventually

#: The pods of the namespace at one moment, by name.
State = dict[str, Any]


class PodHistory:
    """Lists the namespace's pods, then watches them from that listing: ``states()`` is the
    listing and the state after each change since, in the order the API server made them."""

    def __init__(self, core: Any, namespace: str) -> None:
        self._core = core
        self._namespace = namespace
        self._lock = threading.Lock()
        listing = core.list_namespaced_pod(namespace)
        self._current: State = {p.metadata.name: p for p in listing.items}
        self._states: list[State] = [dict(self._current)]
        self._failed: BaseException | None = None
        self._watch = watch.Watch()
        self._thread = threading.Thread(
            target=self._run, args=(listing.metadata.resource_version,), daemon=True
        )
        self._thread.start()

    def _run(self, version: str) -> None:
        try:
            stream = self._watch.stream(
                self._core.list_namespaced_pod, self._namespace, resource_version=version
            )
            for event in stream:
                pod = event["object"]
                with self._lock:
                    if event["type"] == "DELETED":
                        self._current.pop(pod.metadata.name, None)
                    elif event["type"] in ("ADDED", "MODIFIED"):
                        self._current[pod.metadata.name] = pod
                    else:
                        continue
                    self._states.append(dict(self._current))
        except BaseException as exc:  # a gap in the record must fail the test, not hide
            with self._lock:
                self._failed = exc

    def states(self) -> list[State]:
        """Every state recorded so far; fails the test if the watch broke (the record would
        have a gap)."""
        with self._lock:
            if self._failed is not None:
                raise AssertionError(f"the pod watch broke: {self._failed!r}")
            return list(self._states)

    def versions(self, name: str) -> list[Any]:
        """Every version of the pod ``name`` recorded, oldest first, without repeats."""
        found: list[Any] = []
        for state in self.states():
            pod = state.get(name)
            if pod is not None and (
                not found or found[-1].metadata.resource_version != pod.metadata.resource_version
            ):
                found.append(pod)
        return found

    def lowest(self, count: Callable[[State], int], *, since: Callable[[State], bool]) -> int:
        """The smallest ``count`` of the states recorded from the first for which ``since``
        holds, once the record has caught up with the API server."""
        self.caught_up()
        states = self.states()
        first = next((i for i, state in enumerate(states) if since(state)), None)
        assert first is not None, "no state recorded matches since"
        return min(count(state) for state in states[first:])

    def caught_up(self, timeout: float = 60) -> None:
        """Wait until the latest recorded state is the namespace's pods as listed now."""

        def same() -> bool:
            listed = {
                p.metadata.name: p.metadata.resource_version
                for p in self._core.list_namespaced_pod(self._namespace).items
            }
            latest = self.states()[-1]
            return listed == {n: p.metadata.resource_version for n, p in latest.items()}

        eventually(same, timeout=timeout, what="the pod watch to catch up with a listing")

    def close(self) -> None:
        self._watch.stop()
