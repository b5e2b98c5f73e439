"""Output: plain-text tables (no terminal library), JSON and YAML of the views' dicts. Pure."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

#: Longest reason shown in a table cell (the full text is in ``why`` and ``-o json``).
REASON_WIDTH = 100


def age(seconds: int | None) -> str:
    """kubectl's short age: ``45s``, ``7m``, ``3h``, ``2d``."""
    if seconds is None:
        return "<unknown>"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * (2 if unit != "m" else 1):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _cell(value: object) -> str:
    if value is None:
        return "-"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to the widest cell, separated by three spaces, kubectl style."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = []
    for row in [list(headers), *cells]:
        padded = [c.ljust(w) for c, w in zip(row, widths, strict=True)]
        lines.append("   ".join(padded).rstrip())
    return "\n".join(lines) + "\n"


def _short(text: str, width: int = REASON_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def gangs_table(rows: Sequence[Mapping[str, Any]], *, all_namespaces: bool) -> str:
    headers = ["NAME", "SOURCE", "MIN", "BOUND", "MAX", "PHASE", "AGE", "PRIORITY", "REASON"]
    if all_namespaces:
        headers.insert(0, "NAMESPACE")
    out = []
    for r in rows:
        row = [
            r["name"],
            r["source"],
            r["min"],
            r["bound"],
            r["max"],
            r["phase"],
            age(r["ageSeconds"]),
            r["priority"],
            _short(r["reason"]) if r["reason"] else "",
        ]
        if all_namespaces:
            row.insert(0, r["namespace"])
        out.append(row)
    return table(headers, out)


def _islands(row: Mapping[str, Any]) -> str:
    free, sizes = row["islandsFree"], row["islandSizes"]
    if free is None or sizes is None:
        return "-"
    return " ".join(f"{f}/{s}" for f, s in zip(free, sizes, strict=False))


def _notice(row: Mapping[str, Any]) -> str:
    parts = []
    for n in row["notices"]:
        what = " ".join(str(x) for x in (n["source"], n["kind"]) if x) or "notice"
        parts.append(f"{what} by {n['deadline']}" if n["deadline"] else what)
    return "; ".join(parts)


def nodes_table(rows: Sequence[Mapping[str, Any]]) -> str:
    headers = ["NAME", "CAPACITY", "ZONE", "RACK", "GPUS", "FREE", "ISLANDS FREE", "NOTICES"]
    out = [
        [
            r["name"],
            r["capacityType"],
            r["zone"],
            r["rack"],
            r["gpus"],
            r["gpusFree"],
            _islands(r),
            _notice(r),
        ]
        for r in rows
    ]
    return table(headers, out)


def why_text(row: Mapping[str, Any]) -> str:
    """The ``why`` report: the gang, its decision, what is reclaimed for it, its members."""
    lines = [
        f"Gang:      {row['namespace']}/{row['name']} ({row['source']}"
        + (f", PodGroup {row['podGroup']}" if row["podGroup"] else "")
        + ")",
        f"Phase:     {row['phase']}",
        f"Members:   min {_cell(row['min'])}, bound {row['bound']}, max {_cell(row['max'])}, "
        f"{row['members']} live",
        f"Priority:  {_cell(row['priority'])}",
        f"Decision:  {row['decision']}",
    ]
    if row["condition"]:
        cond = row["condition"]
        lines.append(f"Condition: PodScheduled=False {cond['reason']}: {cond['message']}")
    if row["reclaiming"]:
        lines.append("Reclaiming for it:")
        lines.extend(
            f"  {v['pod']} on {_cell(v['node'])}, leaves by {_cell(v['leaveBy'])}"
            for v in row["reclaiming"]
        )
    lines.append("Pods:")
    for pod in row["memberPods"]:
        note = ""
        if pod["leaveBy"]:
            note = f", asked to leave by {pod['leaveBy']} for {_cell(pod['reclaimedFor'])}"
        lines.append(f"  {pod['pod']}  {pod['phase']} on {_cell(pod['node'])}{note}")
    if row["events"]:
        lines.append("Recent events:")
        lines.extend(f"  {e['time']} {e['reason']}: {e['message']}" for e in row["events"])
    return "\n".join(lines) + "\n"


def dump(value: object, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(value, indent=2, sort_keys=True) + "\n"
    return str(yaml.safe_dump(value, sort_keys=True, default_flow_style=False))
