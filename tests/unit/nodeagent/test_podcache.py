"""The pod file a restarted agent starts from: what is saved is what is loaded, and a file that
is missing, cut short, garbled or another node's is one clear log line and no pods, never a
crash."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import MutableMapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from nodeagent.adapters.podcache import MAX_BYTES, MAX_PODS, CacheError, PodCache, decode, encode
from nodeagent.core.events import Pod, PodKey, PodUid

NODE = "gpu-node-3"
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
PODS = (
    Pod(PodKey("train/worker-0"), PodUid("6f1c0a52-0000-4000-8000-000000000000")),
    Pod(
        PodKey("train/worker-1"),
        PodUid("6f1c0a52-0000-4000-8000-000000000001"),
        leave_by=datetime(2026, 3, 1, 12, 2, tzinfo=UTC),
    ),
    Pod(
        PodKey("train/worker-2"),
        PodUid("6f1c0a52-0000-4000-8000-000000000002"),
        leave_by=datetime(2026, 3, 1, 12, 5, tzinfo=UTC),
        reclaimed_for="research/big-run",
        checkpoint_seconds=20.5,
    ),
    Pod(PodKey("kube-system/dcgm-exporter-x"), PodUid("u-daemon"), worker=False, daemon=True),
    Pod(PodKey("web/api-0"), PodUid("u-leaving"), worker=False, leaving=True),
)


def load(path: Path, node: str = NODE) -> tuple[tuple[Pod, ...], list[MutableMapping[str, Any]]]:
    with capture_logs() as logs:
        pods = PodCache(path, node).load()
    return pods, logs


def test_what_is_saved_is_what_a_restarted_agent_loads(tmp_path: Path) -> None:
    path = tmp_path / "state" / "pods.json"
    assert PodCache(path, NODE).save(PODS, NOW)
    pods, logs = load(path)
    assert sorted(pods, key=lambda p: p.uid) == sorted(PODS, key=lambda p: p.uid)
    assert [entry["event"] for entry in logs] == ["pod_cache_loaded"]
    # Only the agent may read or replace it; no temporary file is left behind.
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert os.listdir(path.parent) == ["pods.json"]


def test_the_file_holds_only_what_identifying_a_pod_needs(tmp_path: Path) -> None:
    path = tmp_path / "pods.json"
    PodCache(path, NODE).save(PODS[:2], NOW)
    doc = json.loads(path.read_text())
    assert set(doc) == {"version", "node", "saved_at", "pods"}
    assert doc["node"] == NODE
    assert set(doc["pods"][0]) == {
        "namespace",
        "name",
        "uid",
        "worker",
        "daemon",
        "leave_by",
        "leaving",
        "reclaimed_for",
        "checkpoint_seconds",
    }


def test_an_unchanged_list_is_not_written_again(tmp_path: Path) -> None:
    path = tmp_path / "pods.json"
    cache = PodCache(path, NODE)
    cache.save(PODS, NOW)
    first = path.stat().st_ino
    cache.save(tuple(reversed(PODS)), NOW)  # same pods, another order
    assert path.stat().st_ino == first
    cache.save(PODS[:1], NOW)
    assert path.stat().st_ino != first
    assert load(path)[0] == PODS[:1]


def test_a_missing_file_is_no_pods(tmp_path: Path) -> None:
    pods, logs = load(tmp_path / "pods.json")
    assert pods == ()
    assert [entry["event"] for entry in logs] == ["pod_cache_absent"]


def test_every_truncation_of_the_file_is_no_pods_and_a_log_line(tmp_path: Path) -> None:
    whole = encode(NODE, PODS, NOW).encode()
    path = tmp_path / "pods.json"
    # The final newline is optional; anything shorter than the JSON document is refused.
    for end in range(len(whole) - 1):
        path.write_bytes(whole[:end])
        pods, logs = load(path)
        assert pods == (), end
        assert [(e["event"], e["log_level"]) for e in logs] == [("pod_cache_unreadable", "warning")]
        assert str(logs[0]["error"]).startswith("not JSON"), logs


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"\xff\xfe\x00garbage", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"version": 2, "node": "gpu-node-3", "pods": []}', "version 2"),
        (b'{"version": 1, "node": "gpu-node-9", "pods": []}', "written for node 'gpu-node-9'"),
        (b'{"version": 1, "node": "gpu-node-3", "pods": {}}', "pods is not a list"),
        (b'{"version": 1, "node": "gpu-node-3", "pods": [7]}', "pod 0 is not an object"),
    ],
)
def test_a_garbled_or_foreign_file_is_no_pods(tmp_path: Path, content: bytes, why: str) -> None:
    path = tmp_path / "pods.json"
    path.write_bytes(content)
    pods, logs = load(path)
    assert pods == ()
    assert logs[0]["event"] == "pod_cache_unreadable"
    assert why in str(logs[0]["error"])


def valid() -> dict[str, object]:
    return {
        "namespace": "train",
        "name": "worker-0",
        "uid": "u-0",
        "worker": True,
        "daemon": False,
        "leave_by": None,
        "leaving": False,
    }


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"namespace": ""}, "namespace"),
        ({"namespace": "a/b"}, "namespace contains '/'"),
        ({"name": "n" * 254}, "name"),
        ({"uid": 12}, "uid"),
        ({"worker": "yes"}, "worker"),
        ({"leaving": None}, "leaving"),
        ({"leave_by": 1700000000}, "leave_by"),
        ({"leave_by": "tomorrow"}, "leave_by"),
        ({"leave_by": "99999-01-01T00:00:00Z"}, "leave_by"),
        ({"checkpoint_seconds": "20"}, "checkpoint_seconds"),
        ({"checkpoint_seconds": 0}, "checkpoint_seconds"),
        ({"checkpoint_seconds": True}, "checkpoint_seconds"),
    ],
)
def test_a_pod_with_a_wrong_field_makes_the_whole_file_unusable(
    change: dict[str, object], why: str
) -> None:
    doc = {"version": 1, "node": NODE, "pods": [{**valid(), **change}]}
    with pytest.raises(CacheError, match=why):
        decode(json.dumps(doc).encode(), NODE)


def test_the_same_uid_twice_is_refused() -> None:
    doc = {"version": 1, "node": NODE, "pods": [valid(), {**valid(), "name": "worker-1"}]}
    with pytest.raises(CacheError, match="twice"):
        decode(json.dumps(doc).encode(), NODE)


def test_an_oversized_file_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "pods.json"
    path.write_bytes(b" " * (MAX_BYTES + 1))
    pods, logs = load(path)
    assert pods == ()
    assert "larger than" in str(logs[0]["error"])


def test_the_list_kept_is_bounded(tmp_path: Path) -> None:
    many = [Pod(PodKey(f"ns/p-{i:05d}"), PodUid(f"u-{i}")) for i in range(MAX_PODS + 5)]
    path = tmp_path / "pods.json"
    with capture_logs() as logs:
        PodCache(path, NODE).save(many, NOW)
    assert [e["event"] for e in logs] == ["pod_cache_truncated"]
    assert path.stat().st_size <= MAX_BYTES
    assert len(load(path)[0]) == MAX_PODS


def test_an_unwritable_folder_is_one_log_line_per_streak_and_no_crash(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    cache = PodCache(blocker / "pods.json", NODE)
    with capture_logs() as logs:
        assert not cache.save(PODS, NOW)
        assert not cache.save(PODS[:1], NOW)
    assert [e["event"] for e in logs] == ["pod_cache_unwritable"]
    blocker.unlink()
    with capture_logs() as logs:
        assert cache.save(PODS, NOW)
    assert [e["event"] for e in logs] == ["pod_cache_writable"]
