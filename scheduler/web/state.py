"""The web view's document: the cluster as the scheduler sees it, as JSON-ready values. Pure.

Built from what the loop already has (a cache :class:`Snapshot`, the gangs it built from it, the
gangs it could not read) plus what the reporter was told (each gang's last reason, binds,
reclaims, torn gangs) and what changed between two snapshots (notices, pods that left). Field
names are the page's contract (``scheduler/web/static/app.js``); docs/web-view.md lists them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contracts import names
from scheduler.cache.cache import Snapshot
from scheduler.cycle import has_work, min_waiting, torn
from scheduler.gang import why
from scheduler.model import Gang, GangKey, InvalidGang, Node, PodKey, PodRequest
from scheduler.queue import order_key

#: How many timeline entries the page gets (newest last).
TIMELINE_LENGTH = 200
#: How many changes of its bounds the page shows for each gang (newest last).
BOUND_CHANGES = 20

#: A gang's ``(minimum, maximum)``.
Bounds = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Entry:
    """One line of the timeline: ``kind`` is bind, reclaim, evict, notice, withdrawn, left,
    torn or released."""

    at: float
    kind: str
    text: str
    gang: str | None = None
    pod: str | None = None
    node: str | None = None

    def json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "kind": self.kind,
            "text": self.text,
            "gang": self.gang,
            "pod": self.pod,
            "node": self.node,
        }


@dataclass(frozen=True, slots=True)
class Reason:
    """The last thing the reporter said about a gang that could not be placed; ``code`` is the
    reason of the Event it wrote (``WaitingForRoom``, ``GangBelowMinimum``...; empty: the one
    :func:`scheduler.gang.why.told_reason` gives)."""

    message: str
    waiting: bool
    at: float
    code: str = ""


def clock(at: float) -> str:
    """``HH:MM:SS`` (UTC), as the page shows times."""
    return time.strftime("%H:%M:%S", time.gmtime(at))


def _bounds_text(old: Bounds, new: Bounds) -> str:
    parts = [
        f"{which} {was} -> {now}"
        for which, was, now in (("min", old[0], new[0]), ("max", old[1], new[1]))
        if was != now
    ]
    return ", ".join(parts)


def bound_changes(
    before: Mapping[GangKey, Bounds], gangs: Iterable[Gang], now: float
) -> tuple[dict[GangKey, Bounds], list[Entry]]:
    """Each gang's bounds now, and a ``bounds`` entry for each gang seen before whose minimum
    or maximum changed (a stage change: ``max 4 -> 2``); a gang seen for the first time has
    none."""
    after = {gang.key: (gang.min_member, gang.max_member) for gang in gangs}
    if after == before:  # the common case, compared in C
        return after, []
    found = [
        Entry(now, "bounds", _bounds_text(old, new), gang=key)
        for key, new in after.items()
        if (old := before.get(key)) is not None and old != new
    ]
    return after, found


def revoking(node: Node) -> str | None:
    """The ``shoal.dev/revoking`` taint's value (the notice's source) when the node has it."""
    for taint in node.taints:
        if taint.key == names.REVOKING_TAINT:
            return taint.value or "notice"
    return None


def changes(before: Snapshot | None, after: Snapshot, now: float) -> list[Entry]:
    """Timeline entries for what differs between two snapshots: notices that appeared or were
    withdrawn on nodes, and bound pods that left."""
    if before is None:
        return []
    found: list[Entry] = []
    for name, state in after.nodes.items():
        was = before.nodes.get(name)
        old = revoking(was.node) if was is not None else None
        new = revoking(state.node)
        if new is not None and old is None:
            found.append(Entry(now, "notice", f"notice on {name} ({new})", node=name))
        elif old is not None and new is None:
            found.append(Entry(now, "withdrawn", f"notice withdrawn on {name}", node=name))
    for key, pod in before.pods.items():
        if not pod.holds_resources:
            continue
        now_pod = after.pods.get(key)
        if now_pod is None or not now_pod.holds_resources:
            how = "finished" if now_pod is not None else "left"
            found.append(Entry(now, "left", f"{key} {how} {pod.node}", pod=key, node=pod.node))
    return found


def _gpu_cells(node: Node, pods: Sequence[PodRequest]) -> list[dict[str, Any]]:
    """The node's GPUs by NVLink island, each with the pod holding it (``None``: free).

    GPUs the ``shoal.dev/gpu-topology`` annotation lists as allocated go to their pod; the other
    pods' GPUs are placed the way :func:`scheduler.topology.take` counts them: the tightest
    island that holds the whole pod, else the fullest islands first.
    """
    topo = node.gpu_topology
    islands: dict[int, list[int]] = {}
    health: dict[int, str] = {}
    owner: dict[int, str] = {}
    if topo is None:
        islands[0] = list(range(max(0, node.allocatable.gpu)))
    else:
        for gpu in sorted(topo.gpus, key=lambda g: g.index):
            islands.setdefault(gpu.island, []).append(gpu.index)
            health[gpu.index] = gpu.health
        owner = {index: pod for index, pod in topo.allocated.items()}
    listed = set(owner.values())
    for pod in sorted(pods, key=lambda p: p.key):
        if pod.requests.gpu <= 0 or pod.key in listed:
            continue
        free = {
            i: [g for g in gpus if g not in owner and health.get(g, "healthy") == "healthy"]
            for i, gpus in islands.items()
        }
        fits = [i for i, gpus in free.items() if len(gpus) >= pod.requests.gpu]
        order = (
            [min(fits, key=lambda i: (len(free[i]), i))]
            if fits
            else sorted(free, key=lambda i: (-len(free[i]), i))
        )
        left = pod.requests.gpu
        for i in order:
            for index in free[i]:
                if left == 0:
                    break
                owner[index] = pod.key
                left -= 1
    return [
        {
            "id": island,
            "gpus": [
                {"index": g, "pod": owner.get(g), "health": health.get(g, "healthy")} for g in gpus
            ],
        }
        for island, gpus in sorted(islands.items())
    ]


def _node(
    node: Node, pods: Sequence[PodRequest], free: int, gang_of: Mapping[PodKey, GangKey]
) -> dict[str, Any]:
    cells = _gpu_cells(node, pods)
    for island in cells:
        for gpu in island["gpus"]:
            gpu["gang"] = gang_of.get(gpu["pod"]) if gpu["pod"] else None
    return {
        "name": node.name,
        "rack": node.labels.get(names.RACK_LABEL),
        "zone": node.labels.get(names.ZONE_LABEL),
        "capacityType": "spot" if node.spot else "on-demand",
        "revoking": revoking(node),
        "unschedulable": node.unschedulable,
        "gpus": node.allocatable.gpu,
        "gpusFree": free,
        "islands": cells,
        "pods": [
            {
                "key": p.key,
                "gang": gang_of.get(p.key),
                "gpus": p.requests.gpu,
                "leaving": names.LEAVE_BY_ANNOTATION in p.annotations,
                "reclaimedFor": p.annotations.get(names.RECLAIMED_FOR_ANNOTATION),
            }
            for p in sorted(pods, key=lambda p: p.key)
        ],
    }


def phase(gang: Gang, reason: Reason | None) -> str:
    """Where a gang stands, in the words ``kubectl shoal gangs`` uses."""
    if torn(gang):
        return "Torn"
    if gang.min_missing > 0 and not min_waiting(gang):
        return "WaitingForMembers"
    if gang.min_missing > 0:
        return "Waiting"
    if gang.pending and gang.surplus_room > 0 and reason is not None:
        return "Admitted, surplus waiting"
    return "Admitted"


def _said(gang: Gang, phase_: str, reason: Reason | None) -> tuple[str, str] | None:
    """What the scheduler last told about ``gang``, as ``kubectl shoal why`` reads it from the
    Events: for a torn gang only that it is below its minimum or waits for room."""
    if reason is None or phase_ == "Admitted":
        return None
    code = reason.code or why.told_reason(gang, reason.waiting)
    if phase_ == "Torn" and code not in ("GangBelowMinimum", "WaitingForRoom"):
        return None
    return code, reason.message


def _gang(
    gang: Gang,
    reason: Reason | None,
    queued: int | None,
    victims: Sequence[PodRequest],
    changes: Sequence[Entry],
) -> dict[str, Any]:
    stands = why.phase(gang, bool(victims))
    code, text = why.reason(gang, stands, victims, _said(gang, stands, reason))
    return {
        "key": gang.key,
        "namespace": gang.namespace,
        "name": gang.name,
        "podGroup": gang.pod_group,
        "min": gang.min_member,
        "max": gang.max_member,
        "bound": len(gang.bound),
        "pending": len(gang.pending),
        "priority": gang.priority,
        "created": gang.created,
        "phase": phase(gang, reason),
        "queue": queued,
        "reason": reason.message if reason is not None and has_work(gang) else None,
        "reasonCode": code,
        # The sentence `kubectl shoal why` prints for the gang (its bounds, what it waits for).
        "why": why.decision(
            gang,
            stands,
            bound=sum(1 for p in gang.members if p.node is not None),
            code=code,
            text=text,
            victims=victims,
        ),
        "boundChanges": [
            {"at": e.at, "text": f"{e.text} at {clock(e.at)}"} for e in changes[-BOUND_CHANGES:]
        ],
    }


class NodeMemo:
    """Each node's entry as last built, reused while the node and its pods are the very same
    objects (the cache hands out unchanged values again) and their gangs and free GPUs the
    same: most of a document's cost is its nodes, and most nodes do not change."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[Node, tuple[PodRequest, ...], tuple[Any, ...], Any]] = {}

    def entry(
        self, node: Node, pods: Sequence[PodRequest], free: int, gang_of: Mapping[PodKey, GangKey]
    ) -> dict[str, Any]:
        held = tuple(sorted(pods, key=lambda p: p.key))
        tag = (free, *(gang_of.get(p.key) for p in held))
        kept = self._entries.get(node.name)
        if (
            kept is not None
            and kept[0] is node
            and len(kept[1]) == len(held)
            and all(a is b for a, b in zip(kept[1], held, strict=True))
            and kept[2] == tag
        ):
            return kept[3]  # type: ignore[no-any-return]
        built = _node(node, held, free, gang_of)
        self._entries[node.name] = (node, held, tag, built)
        return built

    def keep_only(self, names_: Iterable[str]) -> None:
        alive = set(names_)
        for name in [n for n in self._entries if n not in alive]:
            del self._entries[name]


def document(
    scheduler: str,
    snapshot: Snapshot,
    *,
    gangs: Iterable[Gang],
    invalid: Iterable[InvalidGang],
    reasons: Mapping[GangKey, Reason],
    timeline: Iterable[Entry],
    now: float,
    memo: NodeMemo | None = None,
    bound_history: Mapping[GangKey, Sequence[Entry]] | None = None,
) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready values (nodes sorted by rack, then name);
    ``memo`` keeps node entries from one document to the next (they must not be changed);
    ``bound_history`` is each gang's ``bounds`` entries, oldest first."""
    gangs = list(gangs)
    memo = memo or NodeMemo()
    history = bound_history or {}
    gang_of: dict[PodKey, GangKey] = {p.key: g.key for g in gangs for p in g.members}
    on_node: dict[str, list[PodRequest]] = {}
    victims: dict[str, list[PodRequest]] = {}
    for pod in snapshot.pods.values():
        if pod.holds_resources and pod.node is not None:
            on_node.setdefault(pod.node, []).append(pod)
        target = pod.annotations.get(names.RECLAIMED_FOR_ANNOTATION)
        if target is not None:
            victims.setdefault(target, []).append(pod)
    nodes = [
        memo.entry(state.node, on_node.get(name, ()), state.free.gpu, gang_of)
        for name, state in snapshot.nodes.items()
    ]
    memo.keep_only(snapshot.nodes)
    nodes.sort(key=lambda n: (n["rack"] or "", n["name"]))
    waiting = sorted((g for g in gangs if has_work(g)), key=lambda g: (not torn(g), order_key(g)))
    position = {g.key: i for i, g in enumerate(waiting, start=1)}
    shown = sorted(gangs, key=lambda g: (position.get(g.key, len(position) + 1), g.key))
    entries = list(timeline)[-TIMELINE_LENGTH:]
    return {
        "scheduler": scheduler,
        "now": now,
        "nodes": nodes,
        "gangs": [
            _gang(
                g,
                reasons.get(g.key),
                position.get(g.key),
                why.reclaimed_for(g.key, victims.get(g.key, ())),
                history.get(g.key, ()),
            )
            for g in shown
        ],
        "invalid": [
            {"key": bad.key, "name": bad.name, "reason": bad.reason, "message": bad.message}
            for bad in sorted(invalid, key=lambda b: b.key)
        ],
        "timeline": [e.json() for e in entries],
    }
