"""The pod file's content: :func:`encode` and :func:`decode`. Pure (bytes and values, no file).

The document holds only what identification and the store's decisions need: for each pod its
namespace, name and uid, whether it is a worker or a daemon, its ``shoal.dev/leave-by`` and
whether it is being deleted, and the gang the scheduler reclaims it for (``shoal.dev/
reclaimed-for``, absent when none), and how long its checkpoint takes (``shoal.dev/
checkpoint-seconds``; absent when it does not say, as in files written before it was kept); and
the node it was written for. Anything else (truncated,
malformed, oversized, another node's) is a :class:`CacheError`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from contracts.names import MAX_CHECKPOINT_SECONDS
from nodeagent.core.events import Pod, PodKey, PodUid, parse_rfc3339, rfc3339

VERSION: Final = 1
FILENAME: Final = "pods.json"
#: A node runs at most a few hundred pods (the kubelet's default limit is 110).
MAX_PODS: Final = 1024
#: Far above MAX_PODS pods; a larger file is refused unread.
MAX_BYTES: Final = 512 * 1024
#: Kubernetes' own limits: a namespace is a DNS label, a name a DNS subdomain, a uid a UUID.
_LIMITS: Final = {"namespace": 63, "name": 253, "uid": 128}
#: ``namespace/name`` of a gang.
_GANG_LIMIT: Final = 63 + 1 + 253


class CacheError(ValueError):
    """The file does not hold a pod list for this node."""


def _pod_doc(pod: Pod) -> dict[str, Any]:
    namespace, name = pod.key.split("/", 1)
    return {
        "namespace": namespace,
        "name": name,
        "uid": pod.uid,
        "worker": pod.worker,
        "daemon": pod.daemon,
        "leave_by": rfc3339(pod.leave_by) if pod.leave_by is not None else None,
        "leaving": pod.leaving,
        "reclaimed_for": pod.reclaimed_for,
        "checkpoint_seconds": pod.checkpoint_seconds,
    }


def encode(node: str, pods: Sequence[Pod], saved_at: datetime) -> str:
    """The file's content for ``pods`` (at most :data:`MAX_PODS` of them, sorted by key)."""
    ordered = sorted(pods, key=lambda p: (p.key, p.uid))[:MAX_PODS]
    doc = {
        "version": VERSION,
        "node": node,
        "saved_at": rfc3339(saved_at),
        "pods": [_pod_doc(p) for p in ordered],
    }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True) + "\n"


def _text(item: dict[str, Any], name: str, index: int) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not 0 < len(value) <= _LIMITS[name]:
        raise CacheError(f"pod {index}: {name} is not a string of 1 to {_LIMITS[name]} characters")
    return value


def _flag(item: dict[str, Any], name: str, index: int) -> bool:
    value = item.get(name)
    if not isinstance(value, bool):
        raise CacheError(f"pod {index}: {name} is not true or false")
    return value


def _pod(item: object, index: int) -> Pod:
    if not isinstance(item, dict):
        raise CacheError(f"pod {index} is not an object")
    namespace = _text(item, "namespace", index)
    if "/" in namespace:
        raise CacheError(f"pod {index}: namespace contains '/'")
    leave_by_text = item.get("leave_by")
    leave_by = None
    if leave_by_text is not None:
        if not isinstance(leave_by_text, str):
            raise CacheError(f"pod {index}: leave_by is not a time")
        try:
            leave_by = parse_rfc3339(leave_by_text)
        except ValueError as exc:
            raise CacheError(f"pod {index}: leave_by: {exc}") from exc
    reclaimed_for = item.get("reclaimed_for")
    if reclaimed_for is not None and (
        not isinstance(reclaimed_for, str) or not 0 < len(reclaimed_for) <= _GANG_LIMIT
    ):
        raise CacheError(f"pod {index}: reclaimed_for is not a gang name")
    checkpoint_seconds = item.get("checkpoint_seconds")
    if checkpoint_seconds is not None and (
        isinstance(checkpoint_seconds, bool)
        or not isinstance(checkpoint_seconds, int | float)
        or not 0 < checkpoint_seconds <= MAX_CHECKPOINT_SECONDS
    ):
        raise CacheError(f"pod {index}: checkpoint_seconds is not a number of seconds")
    return Pod(
        key=PodKey(f"{namespace}/{_text(item, 'name', index)}"),
        uid=PodUid(_text(item, "uid", index)),
        worker=_flag(item, "worker", index),
        daemon=_flag(item, "daemon", index),
        leave_by=leave_by,
        leaving=_flag(item, "leaving", index),
        reclaimed_for=reclaimed_for,
        checkpoint_seconds=float(checkpoint_seconds) if checkpoint_seconds is not None else None,
    )


def decode(data: bytes, node: str) -> tuple[Pod, ...]:
    """The pods in a file written for ``node``; :class:`CacheError` for anything else."""
    if len(data) > MAX_BYTES:
        raise CacheError(f"larger than {MAX_BYTES} bytes")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CacheError(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise CacheError("not a JSON object")
    if doc.get("version") != VERSION:
        raise CacheError(f"version {doc.get('version')!r}, expected {VERSION}")
    if doc.get("node") != node:
        raise CacheError(f"written for node {str(doc.get('node'))[:253]!r}, not {node!r}")
    items = doc.get("pods")
    if not isinstance(items, list):
        raise CacheError("pods is not a list")
    if len(items) > MAX_PODS:
        raise CacheError(f"more than {MAX_PODS} pods")
    pods = tuple(_pod(item, i) for i, item in enumerate(items))
    if len({p.uid for p in pods}) != len(pods):
        raise CacheError("a pod uid appears twice")
    return pods
