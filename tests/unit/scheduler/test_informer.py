"""The list/watch loop: resume from the last resourceVersion, relist on 410 Gone, keep going after
errors. The lister is a scripted stand-in for one generated ``list_*`` method (its HTTP responses
as the API server would send them); the real server is exercised by the integration tests."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

from scheduler.k8s.informer import WATCH_MARGIN, Handlers, Informer


class Response:
    def __init__(self, body: bytes) -> None:
        self.data = body
        self._body = body

    def stream(self, amt: object = None, decode_content: bool = False) -> Iterator[bytes]:
        yield self._body

    def release_conn(self) -> None:
        pass

    def close(self) -> None:
        pass


def listing(rv: str, *names: str) -> Response:
    items = [{"metadata": {"name": n, "resourceVersion": rv}} for n in names]
    return Response(json.dumps({"items": items, "metadata": {"resourceVersion": rv}}).encode())


def events(*lines: dict[str, Any]) -> Response:
    return Response(b"".join(json.dumps(line).encode() + b"\n" for line in lines))


class Script:
    """Answers list and watch calls in order; records the watch resourceVersions asked for."""

    def __init__(self, answers: list[Response | Exception], stop: threading.Event) -> None:
        self.answers = answers
        self.watched_from: list[str] = []
        self.timeouts: list[object] = []
        self.stop = stop

    def __call__(self, **kwargs: Any) -> Response:
        self.timeouts.append(kwargs.get("_request_timeout"))
        if kwargs.get("watch"):
            self.watched_from.append(kwargs["resource_version"])
        if not self.answers:
            self.stop.set()
            return events()
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_watch_resumes_from_the_newest_version_and_relists_after_410() -> None:
    done = threading.Event()
    script = Script(
        [
            listing("10", "a"),
            events(
                {"type": "ADDED", "object": {"metadata": {"name": "b", "resourceVersion": "11"}}},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}},
            ),
            events({"type": "ERROR", "object": {"code": 410, "message": "too old"}}),
            listing("20", "a", "b", "c"),
        ],
        done,
    )
    lists: list[list[str]] = []
    seen: list[tuple[str, str]] = []
    informer = Informer(
        "things",
        script,
        Handlers(
            on_list=lambda items: lists.append([i["metadata"]["name"] for i in items]),
            on_event=lambda kind, obj: seen.append((kind, obj["metadata"]["name"])),
        ),
    )
    informer.start()
    assert done.wait(10)
    informer.stop()
    informer.join(5)
    assert lists == [["a"], ["a", "b", "c"]]
    assert seen == [("ADDED", "b")]
    # Resumed from the bookmark's version, then from the relist's.
    assert script.watched_from[:3] == ["10", "12", "20"]
    assert informer.synced.is_set()


def test_errors_are_retried_not_fatal() -> None:
    done = threading.Event()
    script = Script([RuntimeError("connection reset"), listing("3", "x")], done)
    lists: list[list[str]] = []
    informer = Informer(
        "things",
        script,
        Handlers(
            on_list=lambda items: lists.append([i["metadata"]["name"] for i in items]),
            on_event=lambda kind, obj: None,
        ),
    )
    informer.start()
    assert done.wait(10)
    informer.stop()
    informer.join(5)
    assert lists == [["x"]]


def test_every_list_and_watch_has_a_client_side_timeout() -> None:
    """A silent connection (a stalled proxy, a half-open socket) must end in an error and a
    retry; without a timeout the informer would wait on it forever with a stale cache."""
    done = threading.Event()
    script = Script([listing("1", "a"), events(), listing("2", "a")], done)
    informer = Informer(
        "things",
        script,
        Handlers(on_list=lambda items: None, on_event=lambda kind, obj: None),
        watch_timeout=300,
        request_timeout=20,
    )
    informer.start()
    assert done.wait(10)
    informer.stop()
    informer.join(5)
    assert script.timeouts[0] == 20  # the list
    assert script.timeouts[1] == (20, 300 + WATCH_MARGIN)  # the watch: connect, read
    assert all(t is not None for t in script.timeouts)


def test_a_kind_not_served_is_an_empty_set_until_it_is_installed() -> None:
    from kubernetes.client.exceptions import ApiException

    done = threading.Event()
    script = Script([ApiException(status=404, reason="Not Found"), listing("4", "pg")], done)
    lists: list[list[str]] = []
    informer = Informer(
        "podgroups",
        script,
        Handlers(
            on_list=lambda items: lists.append([i["metadata"]["name"] for i in items]),
            on_event=lambda kind, obj: None,
        ),
        max_backoff=0.01,
        missing_ok=True,
    )
    informer.start()
    assert done.wait(10)
    informer.stop()
    informer.join(5)
    assert lists == [[], ["pg"]]
    assert informer.synced.is_set()


def test_a_watch_refused_with_410_lists_again() -> None:
    from kubernetes.client.exceptions import ApiException

    done = threading.Event()
    script = Script(
        [listing("5", "a"), ApiException(status=410, reason="Gone"), listing("9", "a", "b")], done
    )
    lists: list[list[str]] = []
    informer = Informer(
        "things",
        script,
        Handlers(
            on_list=lambda items: lists.append([i["metadata"]["name"] for i in items]),
            on_event=lambda kind, obj: None,
        ),
    )
    informer.start()
    assert done.wait(10)
    informer.stop()
    informer.join(5)
    assert lists == [["a"], ["a", "b"]]
    assert script.watched_from[:2] == ["5", "9"]
