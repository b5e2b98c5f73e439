"""What both programs share at run time: flag values and Event bodies."""

from __future__ import annotations

import pytest

from common.kubeevents import MAX_MESSAGE, EventSource, event_body
from common.values import parse_bool


def test_bools_in_every_usual_spelling_and_a_clear_error_otherwise() -> None:
    assert [parse_bool(t) for t in ("1", "TRUE", " yes ", "on")] == [True] * 4
    assert [parse_bool(t) for t in ("", "0", "False", "no", "off")] == [False] * 5
    with pytest.raises(ValueError, match="expected true or false, got 'maybe'"):
        parse_bool("maybe")


def test_an_event_names_its_object_by_uid_and_fits_the_api_servers_limit() -> None:
    involved = {"apiVersion": "v1", "kind": "Pod", "name": "w-0", "uid": "u-1", "namespace": "ns"}
    source = EventSource("shoal-scheduler", "shoal-scheduler-1")
    body = event_body(involved, "Warning", "GangReleased", "x" * 5000, by=source, now=0.0)
    assert body["involvedObject"]["uid"] == "u-1"
    assert body["metadata"] == {"generateName": "w-0.", "namespace": "ns"}
    assert len(body["message"]) == MAX_MESSAGE
    assert body["firstTimestamp"] == body["lastTimestamp"] == "1970-01-01T00:00:00Z"
