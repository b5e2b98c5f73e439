"""Raw API JSON (camelCase dicts, as the API server sends them) to the core's frozen values.

Pure functions; the only place that knows the shape of Pod and Node objects (each PodGroup kind
reads its own objects: :mod:`scheduler.gang.kinds`). A value
the scheduler cannot read (a malformed quantity, a topology annotation that does not decode)
is replaced by a safe reading and reported through ``problems`` rather than raised.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from contracts import gputopology, names
from contracts.times import parse_time_or
from scheduler.early_warning import revocation_warning
from scheduler.model import (
    Node,
    NodeName,
    PodKey,
    PodPhase,
    PodRequest,
    Resources,
    SelectorRequirement,
    SelectorTerm,
    Taint,
    Toleration,
)

_SUFFIX: dict[str, Decimal | int] = {
    "": 1,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QUANTITY = re.compile(
    r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
)


class QuantityError(ValueError):
    """Not a Kubernetes resource quantity."""


def quantity(text: object) -> Decimal:
    """A Kubernetes quantity ("500m", "1Gi", "2", "1e3") as an exact decimal."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return Decimal(str(text))
    if not isinstance(text, str):
        raise QuantityError(f"not a quantity: {text!r}")
    match = _QUANTITY.match(text.strip())
    if not match:
        raise QuantityError(f"not a quantity: {text!r}")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation as exc:
        raise QuantityError(f"not a quantity: {text!r}") from exc
    return number * _SUFFIX[match.group(2) or ""]


def _ceil(value: Decimal) -> int:
    return int(-((-value) // 1))


def resources(raw: Mapping[str, Any] | None, *, pods: int = 0) -> Resources:
    """cpu (to millicores, rounded up), memory (bytes), nvidia.com/gpu and pods from a list."""
    raw = raw or {}

    def get(key: str, scale: int = 1) -> int:
        if key not in raw:
            return 0
        try:
            return _ceil(quantity(raw[key]) * scale)
        except QuantityError:
            return 0

    count = get("pods") if "pods" in raw else pods
    return Resources(get("cpu", 1000), get("memory"), get(names.GPU_RESOURCE), count)


def timestamp(text: object) -> float:
    return parse_time_or(text, 0.0)


def _container_requests(container: Mapping[str, Any]) -> Resources:
    res = container.get("resources") or {}
    # Like the API server's defaulting: limits stand in for absent requests.
    merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
    return resources(merged)


def _statuses(status: Mapping[str, Any] | None, field: str) -> dict[str, Mapping[str, Any]]:
    """The container statuses in ``status[field]``, by container name."""
    found: dict[str, Mapping[str, Any]] = {}
    for item in (status or {}).get(field) or []:
        if isinstance(item, Mapping):
            found[str(item.get("name", ""))] = item
    return found


def _counted(container: Mapping[str, Any], status: Mapping[str, Any] | None) -> Resources:
    """What a container is counted for, as kube-scheduler counts a pod with an in-place resize
    (``pods/resize``) requested or under way: for CPU and memory, the largest of its spec, what
    the kubelet allocated (``allocatedResources``) and what it runs with (``resources``), so
    that neither a downsize not yet applied nor an upsize not yet allowed over-commits a node.
    GPUs cannot be resized in place: the spec."""
    spec = _container_requests(container)
    if not status:
        return spec
    allocated = resources(status.get("allocatedResources"))
    actual = resources((status.get("resources") or {}).get("requests"))
    return Resources(
        max(spec.cpu_milli, allocated.cpu_milli, actual.cpu_milli),
        max(spec.memory, allocated.memory, actual.memory),
        spec.gpu,
        0,
    )


def resize_pending(raw: Mapping[str, Any]) -> bool:
    """The pod asks for more CPU or memory for a container than the kubelet has allocated it
    (an in-place upsize, ``pods/resize``, that is not applied yet)."""
    spec = raw.get("spec") or {}
    running = _statuses(raw.get("status") or {}, "containerStatuses")
    for container in spec.get("containers") or []:
        status = running.get(str(container.get("name", "")))
        if not status or "allocatedResources" not in status:
            continue
        wanted = _container_requests(container)
        allocated = resources(status.get("allocatedResources"))
        if wanted.cpu_milli > allocated.cpu_milli or wanted.memory > allocated.memory:
            return True
    return False


def pod_requests(spec: Mapping[str, Any], status: Mapping[str, Any] | None = None) -> Resources:
    """Effective request: sum of containers, at least each init container, plus overhead; each
    container counted for the largest of its spec, allocated and actual CPU and memory."""
    running = _statuses(status, "containerStatuses")
    starting = _statuses(status, "initContainerStatuses")
    total = Resources()
    for container in spec.get("containers") or []:
        total = total + _counted(container, running.get(str(container.get("name", ""))))
    for init in spec.get("initContainers") or []:
        need = _counted(init, starting.get(str(init.get("name", ""))))
        total = Resources(
            max(total.cpu_milli, need.cpu_milli),
            max(total.memory, need.memory),
            max(total.gpu, need.gpu),
            0,
        )
    total = total + resources(spec.get("overhead"))
    return Resources(total.cpu_milli, total.memory, total.gpu, 1)


def _terms(spec: Mapping[str, Any]) -> tuple[SelectorTerm, ...]:
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms: list[SelectorTerm] = []
    for term in required.get("nodeSelectorTerms") or []:
        reqs = tuple(
            SelectorRequirement(
                key=str(e.get("key", "")),
                operator=str(e.get("operator", "")),
                values=tuple(str(v) for v in e.get("values") or ()),
            )
            for e in term.get("matchExpressions") or []
        )
        terms.append(SelectorTerm(reqs))
    return tuple(terms)


def pod(raw: Mapping[str, Any]) -> PodRequest:
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    namespace = str(meta.get("namespace", ""))
    name = str(meta.get("name", ""))
    phase_text = status.get("phase") or "Pending"
    try:
        phase = PodPhase(phase_text)
    except ValueError:
        phase = PodPhase.UNKNOWN
    node = spec.get("nodeName")
    return PodRequest(
        key=PodKey(f"{namespace}/{name}"),
        namespace=namespace,
        name=name,
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion") or ""),
        requests=pod_requests(spec, status),
        scheduler_name=str(spec.get("schedulerName") or "default-scheduler"),
        node=NodeName(node) if node else None,
        phase=phase,
        priority=int(spec.get("priority") or 0),
        priority_class=str(spec.get("priorityClassName") or ""),
        created=timestamp(meta.get("creationTimestamp")),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        node_selector=dict(spec.get("nodeSelector") or {}),
        affinity=_terms(spec),
        tolerations=tuple(
            Toleration(
                key=str(t.get("key") or ""),
                operator=str(t.get("operator") or "Equal"),
                value=str(t.get("value") or ""),
                effect=str(t.get("effect") or ""),
            )
            for t in spec.get("tolerations") or []
        ),
        deleting=bool(meta.get("deletionTimestamp")),
        gated=bool(spec.get("schedulingGates")),
        scheduling_group=str((spec.get("schedulingGroup") or {}).get("podGroupName") or ""),
    )


def node(raw: Mapping[str, Any], problems: list[str] | None = None) -> Node:
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    labels = dict(meta.get("labels") or {})
    annotations = meta.get("annotations") or {}
    topology = None
    text = annotations.get(names.GPU_TOPOLOGY_ANNOTATION)
    if text:
        try:
            topology = gputopology.decode(text)
        except gputopology.TopologyError as exc:
            if problems is not None:
                problems.append(f"annotation {names.GPU_TOPOLOGY_ANNOTATION}: {exc}")
    return Node(
        name=NodeName(str(meta.get("name", ""))),
        labels=labels,
        allocatable=resources(status.get("allocatable")),
        taints=tuple(
            Taint(
                key=str(t.get("key") or ""),
                value=str(t.get("value") or ""),
                effect=str(t.get("effect") or ""),
            )
            for t in spec.get("taints") or []
        ),
        unschedulable=bool(spec.get("unschedulable")),
        spot=names.is_spot(labels),
        gpu_topology=topology,
        early_warning=revocation_warning(annotations.get(names.REVOCATION_ANNOTATION)),
    )
