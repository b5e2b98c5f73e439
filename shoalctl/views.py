"""What ``kubectl shoal`` shows, from raw API objects (camelCase dicts). Pure.

Gangs are built by the scheduler's own gang sources (:func:`scheduler.gang.build.build_gangs`)
from objects converted by the scheduler's own adapter functions (:mod:`scheduler.k8s.convert`),
so a gang here is the gang the scheduler schedules. What the scheduler decided comes from what
it already writes on the objects: the members' ``PodScheduled`` condition (the reason a gang
waits, with per-node counts), its Events (``WaitingForMembers``, ``WaitingForRoom``,
``GangBelowMinimum``, ``PodGroupNotFound``, ``InvalidGang``...), and the ``shoal.dev/leave-by`` and
``shoal.dev/reclaimed-for`` annotations on the pods it reclaims.

Field names of the returned dicts are the plugin's ``-o json|yaml`` contract (README).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contracts import names
from contracts.times import format_time
from scheduler.cache.cache import node_state
from scheduler.gang import why as why_text
from scheduler.gang.build import build_gangs
from scheduler.gang.kinds import KINDS
from scheduler.gang.sources import NAMED
from scheduler.k8s import convert
from scheduler.model import Gang, InvalidGang, PodGroup, PodPhase, PodRequest, split_group_ref

Raw = Mapping[str, Any]

#: The phases a gang is shown in, in the order ``gangs`` sorts them.
PHASES = ("Invalid", "Torn", "Reclaiming", "Waiting", "WaitingForMembers", "Admitted")


@dataclass(frozen=True, slots=True)
class Cluster:
    """What was read: raw pods, nodes and Events, and the PodGroups of every kind (converted)."""

    pods: Sequence[Raw]
    nodes: Sequence[Raw]
    events: Sequence[Raw]
    groups: Sequence[PodGroup]


def _meta(raw: Raw) -> Raw:
    return raw.get("metadata") or {}


def _event_time(event: Raw) -> float:
    for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
        if event.get(key):
            return convert.timestamp(event[key])
    return convert.timestamp(_meta(event).get("creationTimestamp"))


def _one_line(text: str) -> str:
    return " ".join(text.split())


def display_name(gang: Gang | InvalidGang) -> str:
    """The name a user gave: the PodGroup's, the ``shoal.dev/gang`` label's, or the pod's for a
    gang of one (the source column tells them apart; ``key`` is unique)."""
    if gang.pod_group:
        return split_group_ref(gang.pod_group)[2]
    for tag in _TAGS:
        if f"/{tag}:" in gang.key:
            return gang.key.split(f"/{tag}:", 1)[1]
    return gang.name


#: The sources whose gang keys are ``namespace/<tag>:name``, named by their tag.
_TAGS = ("pod", "conflict", *(source.tag for source in NAMED))


def _source(gang: Gang | InvalidGang) -> str:
    if gang.pod_group:
        return KINDS.of_ref(gang.pod_group).title
    for tag in _TAGS:
        if f"/{tag}:" in gang.key:
            return tag
    return "label"


class Index:
    """The objects of one read, indexed for the gang views."""

    def __init__(self, cluster: Cluster, scheduler_name: str) -> None:
        self.cluster = cluster
        self.scheduler_name = scheduler_name
        self.raw_pods = {
            f"{_meta(p).get('namespace')}/{_meta(p).get('name')}": p for p in cluster.pods
        }
        self.pods = [convert.pod(p) for p in cluster.pods]
        groups = {g.ref: g for g in cluster.groups}
        gangs, invalid = build_gangs(self.pods, groups, scheduler_name)
        self.gangs: list[Gang | InvalidGang] = [*gangs, *invalid]
        self.events: dict[tuple[str, str, str], list[Raw]] = {}
        for event in cluster.events:
            if not _ours(event, scheduler_name):
                continue
            obj = event.get("involvedObject") or {}
            key = (str(obj.get("kind")), str(obj.get("namespace")), str(obj.get("name")))
            self.events.setdefault(key, []).append(event)
        for found in self.events.values():
            found.sort(key=_event_time)

    def gang_events(self, gang: Gang | InvalidGang) -> list[Raw]:
        found: list[Raw] = []
        for pod in gang.members:
            found.extend(self.events.get(("Pod", pod.namespace, pod.name), ()))
        if gang.pod_group:
            _, namespace, name = split_group_ref(gang.pod_group)
            found.extend(self.events.get(("PodGroup", namespace, name), ()))
        return sorted(found, key=_event_time)

    def reclaimed_for(self, key: str) -> list[PodRequest]:
        """Live pods the scheduler asked to leave to make room for gang ``key``."""
        return why_text.reclaimed_for(key, self.pods)

    def condition(self, pod: PodRequest) -> Raw | None:
        raw = self.raw_pods.get(pod.key) or {}
        for cond in (raw.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                return dict(cond)
        return None


def _ours(event: Raw, scheduler_name: str) -> bool:
    source = event.get("source") or {}
    return scheduler_name in (event.get("reportingComponent"), source.get("component"))


def _latest_condition(index: Index, gang: Gang | InvalidGang) -> Raw | None:
    found = [c for p in gang.members if p.node is None for c in [index.condition(p)] if c]
    found.sort(key=lambda c: convert.timestamp(c.get("lastTransitionTime")))
    return found[-1] if found else None


def _reason(
    index: Index, gang: Gang | InvalidGang, phase: str, victims: Sequence[PodRequest]
) -> tuple[str, str]:
    """``(code, message)``: why the gang is where it is, in one line, from the newest thing the
    scheduler wrote about it (:func:`scheduler.gang.why.reason` words it)."""
    said: tuple[str, str] | None = None
    if isinstance(gang, Gang) and phase == "Torn":
        # The newest of what it was told: torn and to be released, or (a raised minimum)
        # running while it waits for room.
        told = [
            e
            for e in index.gang_events(gang)
            if e.get("reason") in ("GangBelowMinimum", "WaitingForRoom")
        ]
        if told:
            said = str(told[-1].get("reason")), str(told[-1].get("message") or "")
    elif isinstance(gang, Gang) and phase != "Admitted":
        cond = _latest_condition(index, gang)
        events = index.gang_events(gang)
        if cond is not None:
            said = str(cond.get("reason") or ""), str(cond.get("message") or "")
        elif events:
            said = str(events[-1].get("reason") or ""), str(events[-1].get("message") or "")
    return why_text.reason(gang, phase, victims, said)


def gang_row(index: Index, gang: Gang | InvalidGang, now: float) -> dict[str, Any]:
    victims = index.reclaimed_for(gang.key)
    phase = why_text.phase(gang, bool(victims))
    code, reason = _reason(index, gang, phase, victims)
    valid = isinstance(gang, Gang)
    created = (
        gang.created
        if isinstance(gang, Gang)
        else min((p.created for p in gang.members), default=0.0)
    )
    leaving = [p.key for p in gang.members if names.LEAVE_BY_ANNOTATION in p.annotations]
    return {
        "namespace": gang.namespace,
        "name": display_name(gang),
        "key": gang.key,
        "source": _source(gang),
        "podGroup": gang.pod_group,
        "min": gang.min_member if isinstance(gang, Gang) else None,
        "bound": sum(1 for p in gang.members if p.node is not None),
        "max": gang.max_member if isinstance(gang, Gang) else None,
        "members": len(gang.members),
        "phase": phase,
        "priority": gang.priority if valid and isinstance(gang, Gang) else None,
        "created": format_time(created) if created else None,
        "ageSeconds": max(0, int(now - created)) if created else None,
        "reasonCode": code,
        "reason": reason,
        "leaving": leaving,
        "reclaimedForIt": [p.key for p in victims],
    }


def gangs(cluster: Cluster, scheduler_name: str, now: float) -> list[dict[str, Any]]:
    """Every gang with work for ``scheduler_name``, by namespace and name."""
    index = Index(cluster, scheduler_name)
    rows = [gang_row(index, g, now) for g in index.gangs]
    return sorted(rows, key=lambda r: (r["namespace"], r["name"], r["key"]))


def find_gang(index: Index, namespace: str, name: str) -> Gang | InvalidGang | None:
    """The gang named ``name`` (a gang, a PodGroup, or a member pod) in ``namespace``."""
    for gang in index.gangs:
        if gang.namespace == namespace and display_name(gang) == name:
            return gang
    for gang in index.gangs:
        if any(p.namespace == namespace and p.name == name for p in gang.members):
            return gang
    return None


def why(
    cluster: Cluster, scheduler_name: str, namespace: str, name: str, now: float
) -> dict[str, Any] | None:
    """The gang of ``name`` (a gang or a pod) and its last decision in words; ``None`` when
    there is no such gang."""
    index = Index(cluster, scheduler_name)
    gang = find_gang(index, namespace, name)
    if gang is None:
        return None
    row = gang_row(index, gang, now)
    cond = _latest_condition(index, gang)
    events = index.gang_events(gang)
    victims = index.reclaimed_for(gang.key)
    row["decision"] = why_text.decision(
        gang,
        row["phase"],
        bound=row["bound"],
        code=row["reasonCode"],
        text=row["reason"],
        victims=victims,
    )
    row["condition"] = (
        {
            "reason": cond.get("reason"),
            "message": cond.get("message"),
            "since": cond.get("lastTransitionTime"),
        }
        if cond
        else None
    )
    row["reclaiming"] = [
        {
            "pod": p.key,
            "node": p.node,
            "leaveBy": p.annotations.get(names.LEAVE_BY_ANNOTATION),
        }
        for p in victims
    ]
    row["memberPods"] = [
        {
            "pod": p.key,
            "node": p.node,
            "phase": p.phase.value,
            "leaveBy": p.annotations.get(names.LEAVE_BY_ANNOTATION),
            "reclaimedFor": p.annotations.get(names.RECLAIMED_FOR_ANNOTATION),
        }
        for p in gang.members
    ]
    row["events"] = [
        {
            "reason": e.get("reason"),
            "type": e.get("type"),
            "message": e.get("message"),
            "time": format_time(_event_time(e)),
            "count": e.get("count"),
        }
        for e in events[-5:]
    ]
    return row


def _notices(meta: Raw, taints: Iterable[Raw]) -> list[dict[str, Any]]:
    text = (meta.get("annotations") or {}).get(names.REVOCATION_ANNOTATION)
    found: list[dict[str, Any]] = []
    if text:
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        items = doc.get("notices") if isinstance(doc, dict) else None
        for item in items if isinstance(items, list) else [doc]:
            if isinstance(item, dict):
                found.append(
                    {
                        "source": item.get("source"),
                        "kind": item.get("kind"),
                        "deadline": item.get("deadline"),
                        "reason": item.get("reason"),
                    }
                )
        if not found:
            found.append({"source": None, "kind": None, "deadline": None, "reason": "unreadable"})
    for taint in taints:
        if taint.get("key") == names.REVOKING_TAINT and not found:
            found.append(
                {
                    "source": taint.get("value") or None,
                    "kind": None,
                    "deadline": None,
                    "reason": f"taint {names.REVOKING_TAINT}",
                }
            )
    return found


def nodes(cluster: Cluster, now: float) -> list[dict[str, Any]]:
    """Every node: its GPUs (free per NVLink island when it publishes its topology), rack,
    zone, capacity type and the revocation notices in force."""
    del now
    on_node: dict[str, list[PodRequest]] = {}
    for pod in (convert.pod(p) for p in cluster.pods):
        if pod.node and pod.phase not in (PodPhase.SUCCEEDED, PodPhase.FAILED):
            on_node.setdefault(pod.node, []).append(pod)
    rows = []
    for raw in cluster.nodes:
        problems: list[str] = []
        node = convert.node(raw, problems)
        state = node_state(node, on_node.get(node.name, ()))
        meta = _meta(raw)
        taints = (raw.get("spec") or {}).get("taints") or []
        rows.append(
            {
                "name": node.name,
                "capacityType": "spot" if node.spot else "on-demand",
                "zone": node.labels.get(names.ZONE_LABEL),
                "rack": node.labels.get(names.RACK_LABEL),
                "gpus": node.allocatable.gpu,
                "gpusFree": state.free.gpu,
                "islandsFree": list(state.islands) if state.islands is not None else None,
                "islandSizes": (
                    [len(m) for _, m in sorted(node.gpu_topology.islands().items())]
                    if node.gpu_topology is not None
                    else None
                ),
                "pods": len(on_node.get(node.name, ())),
                "unschedulable": node.unschedulable,
                "revoking": any(t.get("key") == names.REVOKING_TAINT for t in taints),
                "notices": _notices(meta, taints),
                "problems": problems,
            }
        )
    return sorted(rows, key=lambda r: r["name"])
