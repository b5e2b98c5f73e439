"""Reading a cluster description, a job trace and a spot trace into plain values.

Cluster description (JSON)::

    {"node_groups": [{"count": 16, "gpus": 8, "zones": 1, "racks_per_zone": 2,
                      "spot_fraction": 0.5, "island_size": 4, "cpu": 96, "memory_gib": 1024}]}

or a Tiresias cluster shape CSV (``num_switch,num_node_p_switch,num_gpu_p_node,...``: a switch
is a rack; every ``n*g*.csv`` and ``cluster_spec.csv`` of the Tiresias simulator reads as it is).
Job traces: the Philly trace as prepared for Pollux (``timestamp,duration,num_gpus``), the
Tiresias job list (``job_id,num_gpu,submit_time,...,duration``), a Pollux workload
(``name,time,application,num_replicas,batch_size``) or the native format
(``submit,duration,gpus[,min_pods,max_pods,priority]``). Spot traces: ``milliseconds,add|remove,
nodeN`` lines.

The elastic rule for traces that only give a GPU count ``G`` (Philly, Tiresias, native without
min/max): members of ``p = min(G, GPUs per node)`` GPUs, ``n = ceil(G / p)`` members, minimum
``ceil(n / 2)``, maximum ``n``; the duration is the job's run time at full size, and work scales
linearly with the members running.

Pollux workloads give a gang size (``num_replicas``, one GPU each) but no duration: a job is
``n = num_replicas`` members of one GPU, minimum ``ceil(n / 2)``, maximum ``n``, and runs for
:data:`POLLUX_DURATIONS` of its application at full size — a stated assumption, not data.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from contracts import gputopology, names
from scheduler.model import Node, NodeName, Resources

#: Run time at full size (seconds) per Pollux application; the workload files carry none. Round
#: figures ordered as the applications' training cost (NCF and CIFAR-10 small, ImageNet largest).
POLLUX_DURATIONS: dict[str, float] = {
    "ncf": 900.0,
    "cifar10": 1800.0,
    "bert": 3600.0,
    "deepspeech2": 7200.0,
    "yolov3": 14400.0,
    "imagenet": 28800.0,
}


class InputError(ValueError):
    """A file could not be read as the format it claims; the message names file and line."""


@dataclass(frozen=True, slots=True)
class NodeGroup:
    count: int
    gpus: int = 8
    zones: int = 1
    racks_per_zone: int = 1
    spot_fraction: float = 0.0
    island_size: int = 4
    cpu: int = 96
    memory_gib: int = 1024
    prefix: str = "node"


@dataclass(frozen=True, slots=True)
class JobSpec:
    id: str
    submit: float
    duration: float
    pod_gpus: int
    min_pods: int
    max_pods: int
    priority: int = 0

    @property
    def gpus(self) -> int:
        return self.pod_gpus * self.max_pods


@dataclass(frozen=True, slots=True)
class SpotEvent:
    time: float
    kind: str  # "add" | "remove"
    node: str


def _int(value: str, where: str) -> int:
    try:
        return int(float(value))
    except ValueError as exc:
        raise InputError(f"{where}: {value!r} is not a number") from exc


def _float(value: str, where: str) -> float:
    try:
        result = float(value)
    except ValueError as exc:
        raise InputError(f"{where}: {value!r} is not a number") from exc
    if not math.isfinite(result):
        raise InputError(f"{where}: {value!r} is not a finite number")
    return result


def load_cluster(path: Path) -> list[NodeGroup]:
    text = path.read_text()
    groups: list[NodeGroup] = []
    if path.suffix == ".csv":
        for i, row in enumerate(csv.DictReader(text.splitlines()), 2):
            where = f"{path}:{i}"
            try:
                switches = _int(row["num_switch"], where)
                per_switch = _int(row["num_node_p_switch"], where)
                groups.append(
                    NodeGroup(
                        count=switches * per_switch,
                        gpus=_int(row["num_gpu_p_node"], where),
                        racks_per_zone=max(1, switches),
                        cpu=_int(row.get("num_cpu_p_node") or "96", where),
                        memory_gib=_int(row.get("mem_p_node") or "1024", where),
                        prefix=f"g{len(groups)}",
                    )
                )
            except KeyError as exc:
                raise InputError(f"{where}: missing column {exc}") from exc
        return groups
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not JSON: {exc}") from exc
    raw_groups = doc.get("node_groups") if isinstance(doc, dict) else None
    if not isinstance(raw_groups, list) or not raw_groups:
        raise InputError(f"{path}: expected {{'node_groups': [...]}} with at least one group")
    fields = set(NodeGroup.__dataclass_fields__)
    for i, raw in enumerate(raw_groups):
        if not isinstance(raw, dict) or "count" not in raw:
            raise InputError(f"{path}: node_groups[{i}] must be an object with a count")
        unknown = set(raw) - fields
        if unknown:
            raise InputError(f"{path}: node_groups[{i}]: unknown fields {sorted(unknown)}")
        raw.setdefault("prefix", f"g{i}")
        groups.append(NodeGroup(**raw))
    return groups


def build_nodes(groups: list[NodeGroup]) -> list[Node]:
    """Nodes with rack/zone labels, spot mixed into every rack, and uniform GPU islands."""
    nodes: list[Node] = []
    for g in groups:
        racks = g.zones * g.racks_per_zone
        for i in range(g.count):
            rack = i * racks // max(g.count, 1)
            first = math.ceil(rack * g.count / racks)
            size = math.ceil((rack + 1) * g.count / racks) - first
            spot = (i - first) >= size - round(size * g.spot_fraction)
            name = NodeName(f"{g.prefix}-{i:04d}")
            labels = {
                names.ZONE_LABEL: f"{g.prefix}-zone-{rack // g.racks_per_zone}",
                names.RACK_LABEL: f"{g.prefix}-rack-{rack}",
                names.CAPACITY_TYPE_LABEL: "spot" if spot else "on-demand",
            }
            topo = gputopology.uniform(g.gpus, g.island_size, node_name=name) if g.gpus else None
            nodes.append(
                Node(
                    name=name,
                    labels=labels,
                    allocatable=Resources(g.cpu * 1000, g.memory_gib * 2**30, g.gpus, 110),
                    spot=spot,
                    gpu_topology=topo,
                )
            )
    return nodes


def elastic(job_id: str, submit: float, duration: float, gpus: int, node_gpus: int) -> JobSpec:
    pod_gpus = max(1, min(gpus, node_gpus))
    pods = math.ceil(gpus / pod_gpus)
    return JobSpec(job_id, submit, duration, pod_gpus, max(1, math.ceil(pods / 2)), pods)


def load_jobs(
    path: Path, node_gpus: int, *, limit: int | None = None, min_gpus: int = 0
) -> list[JobSpec]:
    """The first ``limit`` jobs by submit time among those of at least ``min_gpus`` GPUs (at
    full size), times relative to the first submission."""
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        header = set(reader.fieldnames or ())
        jobs = [j for j in _rows(reader, header, path, node_gpus) if j.gpus >= min_gpus]
    if not jobs:
        raise InputError(f"{path}: no jobs" + (f" of {min_gpus}+ GPUs" if min_gpus else ""))
    jobs.sort(key=lambda j: (j.submit, j.id))
    if limit is not None:
        jobs = jobs[:limit]
    start = jobs[0].submit
    return [
        JobSpec(j.id, j.submit - start, j.duration, j.pod_gpus, j.min_pods, j.max_pods, j.priority)
        for j in jobs
    ]


def _rows(
    reader: csv.DictReader[str], header: set[str], path: Path, node_gpus: int
) -> Iterator[JobSpec]:
    """Each row as a job, read as the trace format its columns name (tried in the order of
    :data:`_TRACE_FORMATS`). Unknown columns are refused at the first row, so an empty trace
    reads as no jobs."""
    read = next((read for columns, read in _TRACE_FORMATS if columns <= header), None)
    for n, row in enumerate(reader, 2):
        if read is None:
            raise InputError(f"{path}: unknown job trace columns {sorted(header)}")
        yield read(row, n, f"{path}:{n}", node_gpus)


def _philly(row: Mapping[str, str], line: int, where: str, node_gpus: int) -> JobSpec:
    """The Philly trace as prepared for Pollux: an ISO timestamp and a GPU count."""
    try:
        when = dt.datetime.fromisoformat(row["timestamp"]).replace(tzinfo=dt.UTC)
    except ValueError as exc:
        raise InputError(f"{where}: bad timestamp {row['timestamp']!r}") from exc
    return elastic(
        f"philly-{line - 1}",
        when.timestamp(),
        _float(row["duration"], where),
        _int(row["num_gpus"], where),
        node_gpus,
    )


def _tiresias(row: Mapping[str, str], line: int, where: str, node_gpus: int) -> JobSpec:
    """The Tiresias job list: its own job ids, submit times in seconds, a GPU count."""
    return elastic(
        f"tiresias-{row['job_id']}",
        _float(row["submit_time"], where),
        _float(row["duration"], where),
        _int(row["num_gpu"], where),
        node_gpus,
    )


def _pollux(row: Mapping[str, str], line: int, where: str, node_gpus: int) -> JobSpec:
    """A Pollux workload: ``num_replicas`` one-GPU members, run time by application."""
    app = row["application"]
    if app not in POLLUX_DURATIONS:
        raise InputError(f"{where}: unknown application {app!r}; known: {sorted(POLLUX_DURATIONS)}")
    replicas = _int(row["num_replicas"], where)
    if replicas < 1:
        raise InputError(f"{where}: num_replicas must be at least 1, got {replicas}")
    return JobSpec(
        f"pollux-{row['name']}",
        _float(row["time"], where),
        POLLUX_DURATIONS[app],
        1,
        math.ceil(replicas / 2),
        replicas,
    )


def _native(row: Mapping[str, str], line: int, where: str, node_gpus: int) -> JobSpec:
    """The native format: the elastic rule unless the row gives min/max pods; a priority."""
    base = elastic(
        f"job-{line - 1}",
        _float(row["submit"], where),
        _float(row["duration"], where),
        _int(row["gpus"], where),
        node_gpus,
    )
    min_pods = _int(row.get("min_pods") or str(base.min_pods), where)
    max_pods = _int(row.get("max_pods") or str(base.max_pods), where)
    if not 1 <= min_pods <= max_pods:
        raise InputError(f"{where}: need 1 <= min_pods <= max_pods, got {min_pods}, {max_pods}")
    return JobSpec(
        base.id,
        base.submit,
        base.duration,
        base.pod_gpus,
        min_pods,
        max_pods,
        _int(row.get("priority") or "0", where),
    )


#: Reads one row of a job trace: the row, its line number, "file:line", GPUs per node.
_RowReader = Callable[[Mapping[str, str], int, str, int], JobSpec]

#: The job trace formats by the columns that identify them, tried in this order.
_TRACE_FORMATS: tuple[tuple[frozenset[str], _RowReader], ...] = (
    (frozenset({"timestamp", "duration", "num_gpus"}), _philly),
    (frozenset({"job_id", "num_gpu", "submit_time", "duration"}), _tiresias),
    (frozenset({"name", "time", "application", "num_replicas"}), _pollux),
    (frozenset({"submit", "duration", "gpus"}), _native),
)


def load_spot(path: Path) -> list[SpotEvent]:
    events = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or parts[1] not in ("add", "remove"):
            raise InputError(f"{path}:{n}: expected 'milliseconds,add|remove,node', got {line!r}")
        events.append(SpotEvent(_float(parts[0], f"{path}:{n}") / 1000.0, parts[1], parts[2]))
    events.sort(key=lambda e: e.time)
    return events


def repeat_spot(events: list[SpotEvent], *, until: float) -> list[SpotEvent]:
    """The trace replayed back to back until ``until``; each replay's instances are distinct.

    Instances still running at the end of one replay are revoked there, so every replay starts
    from the trace's own initial state.
    """
    if not events:
        return []
    period = max(e.time for e in events) + 1.0
    out: list[SpotEvent] = []
    replay = 0
    while replay * period <= until:
        offset = replay * period
        running: set[str] = set()
        for e in events:
            name = f"{e.node}#{replay}"
            out.append(SpotEvent(e.time + offset, e.kind, name))
            if e.kind == "add":
                running.add(name)
            else:
                running.discard(name)
        out.extend(SpotEvent(offset + period - 0.5, "remove", n) for n in sorted(running))
        replay += 1
    out.sort(key=lambda e: e.time)
    return out
