"""The web view's document (what the page shows) and its server: every read answered, every
write refused with 405, nothing from the data ever sent as markup."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from contracts import names
from scheduler import settings
from scheduler.cache import Cache
from scheduler.gang.build import build_gangs
from scheduler.model import GangKey, NodeName, Taint
from scheduler.web import server, state
from scheduler.web.feed import Feed, Tee
from scheduler.web.state import Entry, Reason
from tests.unit.scheduler.builders import SCHED, node, pod, snapshot

MARKUP = '<img src=x onerror="document.title=1">'
STATIC = Path(server.__file__).with_name("static")


def _cluster() -> tuple[Any, Any, Any]:
    nodes = [
        node("a1", gpus=8, island_size=4, rack="r-a"),
        node("a2", gpus=8, island_size=4, rack="r-a", spot=True),
        node(
            "b1",
            gpus=4,
            rack="r-b",
            taints=(Taint(names.REVOKING_TAINT, "aws", "NoSchedule"),),
        ),
    ]
    pods = [
        *(pod(f"train-{i}", gang="train", min_member="2", gpus=4, node="a1") for i in range(2)),
        pod("wait-0", gang="wait", min_member="2", gpus=8, created=5.0),
        pod("wait-1", gang="wait", min_member="2", gpus=8, created=5.0),
        pod("lone", gang="lone", min_member="3", gpus=1, created=1.0),
        pod("bad-0", gang="bad", min_member=MARKUP),
        pod("other", gpus=2, node="b1", scheduler="default-scheduler"),
    ]
    snap = snapshot(nodes, pods)
    gangs, invalid = build_gangs(snap.pods.values(), snap.pod_groups, SCHED)
    return snap, gangs, invalid


def _document(**extra: Any) -> dict[str, Any]:
    snap, gangs, invalid = _cluster()
    args: dict[str, Any] = {
        "gangs": gangs,
        "invalid": invalid,
        "reasons": {},
        "timeline": [],
        "now": 100.0,
    }
    args.update(extra)
    return state.document(SCHED, snap, **args)


def _owners(doc: dict[str, Any], name: str) -> list[list[str | None]]:
    found = next(n for n in doc["nodes"] if n["name"] == name)
    return [[g["gang"] for g in island["gpus"]] for island in found["islands"]]


def test_nodes_show_racks_islands_spot_revoking_and_whose_gpus() -> None:
    doc = _document()
    assert [(n["rack"], n["name"]) for n in doc["nodes"]] == [
        ("r-a", "a1"),
        ("r-a", "a2"),
        ("r-b", "b1"),
    ]
    # Two 4-GPU members of ns/train fill both NVLink islands of a1, one island each.
    assert _owners(doc, "a1") == [["ns/train"] * 4, ["ns/train"] * 4]
    a1 = doc["nodes"][0]
    assert a1["gpusFree"] == 0
    assert {g["pod"] for g in a1["islands"][0]["gpus"]} != {
        g["pod"] for g in a1["islands"][1]["gpus"]
    }
    a2 = doc["nodes"][1]
    assert (a2["capacityType"], a2["revoking"], a2["gpusFree"]) == ("spot", None, 8)
    b1 = doc["nodes"][2]
    # No topology: one row of GPUs; a pod of another scheduler holds two, in no gang.
    assert b1["revoking"] == "aws"
    assert _owners(doc, "b1") == [[None, None, None, None]]
    assert [g["pod"] for g in b1["islands"][0]["gpus"]] == ["ns/other", "ns/other", None, None]


def test_gpus_the_topology_lists_go_to_their_pod() -> None:
    snap = snapshot(
        [node("t", gpus=8, island_size=4, allocated={5: "ns/x-0"})],
        [pod("x-0", gang="x", gpus=1, node="t"), pod("y-0", gang="y", gpus=4, node="t")],
    )
    gangs, invalid = build_gangs(snap.pods.values(), snap.pod_groups, SCHED)
    doc = state.document(
        SCHED, snap, gangs=gangs, invalid=invalid, reasons={}, timeline=[], now=0.0
    )
    # x-0 holds GPU 5 (island 1) as the agent says; y-0's 4 GPUs fit whole only in island 0.
    assert _owners(doc, "t") == [["ns/y"] * 4, [None, "ns/x", None, None]]


def test_queue_order_phases_and_reasons() -> None:
    reasons = {
        GangKey("ns/wait"): Reason("0/3 nodes are available: 3 Insufficient GPU.", False, 9.0),
        GangKey("ns/train"): Reason("stale: was waiting before it was placed", False, 1.0),
    }
    doc = _document(reasons=reasons)
    rows = {g["key"]: g for g in doc["gangs"]}
    # Waiting gangs first, in the scheduler's order (priority, then age); placed gangs after.
    assert [g["key"] for g in doc["gangs"]] == ["ns/lone", "ns/wait", "ns/train"]
    assert (rows["ns/lone"]["queue"], rows["ns/lone"]["phase"]) == (1, "WaitingForMembers")
    assert (rows["ns/wait"]["queue"], rows["ns/wait"]["phase"]) == (2, "Waiting")
    assert rows["ns/wait"]["reason"] == "0/3 nodes are available: 3 Insufficient GPU."
    assert (rows["ns/train"]["queue"], rows["ns/train"]["phase"]) == (None, "Admitted")
    assert rows["ns/train"]["reason"] is None
    assert (rows["ns/train"]["bound"], rows["ns/train"]["min"]) == (2, 2)
    [bad] = doc["invalid"]
    assert bad["key"] == "ns/bad"
    assert MARKUP in bad["message"]
    json.dumps(doc)  # JSON-ready as it is


def test_changes_are_notices_withdrawals_and_pods_that_left() -> None:
    plain = node("n", gpus=4)
    tainted = node("n", gpus=4, taints=(Taint(names.REVOKING_TAINT, "gcp", "NoSchedule"),))
    bound = pod("p", gang="g", node="n")
    before = snapshot([plain], [bound])
    noticed = snapshot([tainted], [bound])
    gone = snapshot([plain], [])
    assert state.changes(None, before, 1.0) == []
    assert [(e.kind, e.node) for e in state.changes(before, noticed, 2.0)] == [("notice", "n")]
    assert [(e.kind, e.pod) for e in state.changes(noticed, gone, 3.0)] == [
        ("withdrawn", None),
        ("left", "ns/p"),
    ]


class _Inner:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: self.calls.append(name)


def test_tee_tells_the_reporter_everything_and_the_feed_what_it_shows() -> None:
    inner = _Inner()
    feed = Feed(SCHED, clock=lambda: 7.0)
    assert feed.document() is None  # nothing before the loop's first cycle
    snap, gangs, invalid = _cluster()
    tee = Tee(inner, feed)
    train = next(g for g in gangs if g.key == "ns/train")
    wait = next(g for g in gangs if g.key == "ns/wait")
    tee.scheduled(train, train.members[0], NodeName("a1"))
    tee.unschedulable(wait, wait.pending, "no room", waiting=False)
    tee.asked_to_leave(train.members[1], wait, 40.0)
    tee.invalid(invalid[0])
    feed.observe(snap, gangs, invalid, 8.0)
    doc = feed.document()
    assert doc is not None
    assert inner.calls == ["scheduled", "unschedulable", "asked_to_leave", "invalid"]
    assert [(e["kind"], e["pod"], e["node"]) for e in doc["timeline"]] == [
        ("bind", "ns/train-0", "a1"),
        ("reclaim", "ns/train-1", "a1"),
    ]
    assert next(g for g in doc["gangs"] if g["key"] == "ns/wait")["reason"] == "no room"


def test_timeline_is_bounded() -> None:
    entries = [Entry(float(i), "bind", str(i)) for i in range(state.TIMELINE_LENGTH + 50)]
    doc = _document(timeline=entries)
    assert len(doc["timeline"]) == state.TIMELINE_LENGTH
    assert doc["timeline"][-1]["text"] == str(state.TIMELINE_LENGTH + 49)


def test_the_page_sets_data_only_as_text() -> None:
    """The page's script never turns data into markup (the test in a browser is
    tests/integration/scheduler/test_web_view.py)."""
    script = (STATIC / "app.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script
    page = (STATIC / "index.html").read_text()
    assert "http" not in page.replace("http-equiv", "")  # nothing loaded from elsewhere


WRITES = ("POST", "PUT", "PATCH", "DELETE", "OPTIONS", "PROPFIND", "TRACE")


async def test_server_answers_reads_and_refuses_every_write() -> None:
    feed = Feed(SCHED)
    snap, gangs, invalid = _cluster()
    feed.observe(snap, gangs, invalid, 1.0)
    view = await server.serve("127.0.0.1", 0, feed, interval=0.05)
    url = f"http://127.0.0.1:{view.port}"
    try:
        async with aiohttp.ClientSession() as http:
            for path, kind in (("/", "text/html"), ("/app.js", "text/javascript")):
                async with http.get(url + path) as resp:
                    assert resp.status == 200
                    assert resp.content_type == kind
                    assert "script-src 'self'" in resp.headers["Content-Security-Policy"]
            async with http.get(url + "/state") as resp:
                doc = await resp.json()
            assert {n["name"] for n in doc["nodes"]} == {"a1", "a2", "b1"}
            async with http.get(url + "/events") as resp:
                assert resp.content_type == "text/event-stream"
                assert await resp.content.readline() == b"event: state\n"
                line = await resp.content.readline()
                assert json.loads(line.removeprefix(b"data: "))["scheduler"] == SCHED
            async with http.get(url + "/nothing-here") as resp:
                assert resp.status == 404
            for path in ("/", "/state", "/events", "/app.js", "/anything"):
                for method in WRITES:
                    async with http.request(method, url + path, data=b"{}") as resp:
                        assert (method, path, resp.status) == (method, path, 405)
                        assert resp.headers["Allow"] == "GET,HEAD"
            async with http.get(url + "/state") as resp:
                assert await resp.json() == doc  # the writes changed nothing
    finally:
        await view.close()


def test_the_flag_is_off_by_default_and_loopback_unless_a_host_is_given() -> None:
    assert settings.resolve([], env={}).web_view == ""
    assert settings.resolve(["--web-view", "10261"], env={}).web_view == "127.0.0.1:10261"
    assert settings.resolve(["--web-view", ":0"], env={}).web_view == "127.0.0.1:0"
    given = settings.resolve([], env={"SHOAL_SCHEDULER_WEB_VIEW": "0.0.0.0:8080"}).web_view
    assert settings.split_address(given) == ("0.0.0.0", 8080)
    assert settings.split_address(settings._address("[::1]:9")) == ("::1", 9)
    with pytest.raises(settings.SettingsError, match="--web-view: expected HOST:PORT"):
        settings.resolve(["--web-view", "localhost:http"], env={})


def test_nodes_that_did_not_change_are_reused_and_the_others_rebuilt() -> None:
    cache = Cache()
    for name in ("m1", "m2"):
        cache.set_node(node(name, gpus=8, island_size=4))
    cache.set_pod(pod("j-0", gang="j", gpus=2, node="m1"))
    memo = state.NodeMemo()

    def build() -> dict[str, Any]:
        snap = cache.snapshot()
        gangs, invalid = build_gangs(snap.pods.values(), snap.pod_groups, SCHED)
        return state.document(
            SCHED, snap, gangs=gangs, invalid=invalid, reasons={}, timeline=[], now=0, memo=memo
        )

    before = build()
    cache.set_pod(pod("j-1", gang="j", gpus=2, node="m2"))
    after = build()
    assert after["nodes"][0] is before["nodes"][0]  # m1: the same pods, the same entry
    assert _owners(before, "m2") == [[None] * 4, [None] * 4]
    assert _owners(after, "m2") == [["ns/j", "ns/j", None, None], [None] * 4]
    assert after["nodes"][1]["gpusFree"] == 6
