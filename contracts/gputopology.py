"""The ``shoal.dev/gpu-topology`` node annotation: a compact, versioned JSON document.

The node agent writes it from NVML and the kubelet PodResources API; the scheduler reads it to
keep multi-GPU pods inside one NVLink island; devcluster writes synthetic ones for fake nodes.

Version 1::

    {
      "version": 1,
      "product": "NVIDIA H100 80GB HBM3",            # optional
      "gpus": [
        {"index": 0, "uuid": "GPU-...", "numa": 0, "health": "healthy", "island": 0},
        ...
      ],
      "links": [["X", "NV18", ...], ...],             # square, nvidia-smi topo -m levels
      "allocated": {"0": "namespace/pod", ...}        # GPU index -> pod, from PodResources
    }

``links[i][j]`` is ``"X"`` on the diagonal, ``"NV<n>"`` for ``n`` NVLinks between the two GPUs,
or the PCIe path level ``PIX``, ``PXB``, ``PHB``, ``NODE`` or ``SYS``. An island is a set of GPUs
joined by NVLink/NVSwitch. ``decode`` rejects anything else with a message naming the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, cast

VERSION: Final = 1
Health = Literal["healthy", "degraded", "failed"]
HEALTH_VALUES: Final[frozenset[str]] = frozenset({"healthy", "degraded", "failed"})
PCIE_LEVELS: Final = ("PIX", "PXB", "PHB", "NODE", "SYS")
_NVLINK = re.compile(r"NV([1-9][0-9]{0,2})")
#: An annotation larger than this is refused before parsing (a 1,024-GPU node fits easily).
MAX_DOCUMENT_BYTES: Final = 256 * 1024


class TopologyError(ValueError):
    """The annotation is not a valid GPU topology document; the message names the field."""


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str
    numa: int
    health: Health
    island: int


@dataclass(frozen=True, slots=True)
class GpuTopology:
    gpus: tuple[Gpu, ...]
    links: tuple[tuple[str, ...], ...]
    allocated: Mapping[int, str] = field(default_factory=dict)
    product: str | None = None

    def islands(self) -> dict[int, frozenset[int]]:
        """Island id -> the indices of the GPUs in it."""
        found: dict[int, set[int]] = {}
        for gpu in self.gpus:
            found.setdefault(gpu.island, set()).add(gpu.index)
        return {island: frozenset(members) for island, members in found.items()}

    def free(self) -> frozenset[int]:
        """Healthy GPUs not allocated to any pod."""
        return frozenset(
            g.index for g in self.gpus if g.health == "healthy" and g.index not in self.allocated
        )

    def largest_free_island(self) -> int:
        """How many free GPUs the best single island still has (0 when none are free)."""
        free = self.free()
        return max((len(members & free) for members in self.islands().values()), default=0)


def nvlink_count(level: str) -> int:
    """Number of NVLinks a link level names (0 for PCIe levels and the diagonal)."""
    match = _NVLINK.fullmatch(level)
    return int(match.group(1)) if match else 0


def uniform(
    gpu_count: int,
    island_size: int,
    *,
    numa_nodes: int = 2,
    nvlinks: int = 18,
    node_name: str = "node",
    product: str | None = None,
) -> GpuTopology:
    """A symmetric node: islands of ``island_size`` GPUs joined by NVLink, PCIe between islands.

    ``island_size`` of 1 means no NVLink at all. GPUs are spread over ``numa_nodes`` in order.
    """
    if gpu_count < 0 or island_size < 1 or numa_nodes < 1:
        raise ValueError("gpu_count >= 0, island_size >= 1 and numa_nodes >= 1 are required")
    per_numa = max(1, -(-gpu_count // numa_nodes))
    gpus = tuple(
        Gpu(
            index=i,
            uuid=f"GPU-{node_name}-{i:04d}",
            numa=min(i // per_numa, numa_nodes - 1),
            health="healthy",
            island=i // island_size,
        )
        for i in range(gpu_count)
    )
    rows: list[tuple[str, ...]] = []
    for a in gpus:
        row: list[str] = []
        for b in gpus:
            if a.index == b.index:
                row.append("X")
            elif a.island == b.island and island_size > 1:
                row.append(f"NV{nvlinks}")
            elif a.numa == b.numa:
                row.append("NODE")
            else:
                row.append("SYS")
        rows.append(tuple(row))
    return GpuTopology(gpus=gpus, links=tuple(rows), product=product)


def encode(topology: GpuTopology) -> str:
    """The annotation value (compact JSON, stable key order)."""
    doc: dict[str, Any] = {"version": VERSION}
    if topology.product is not None:
        doc["product"] = topology.product
    doc["gpus"] = [
        {"index": g.index, "uuid": g.uuid, "numa": g.numa, "health": g.health, "island": g.island}
        for g in topology.gpus
    ]
    doc["links"] = [list(row) for row in topology.links]
    doc["allocated"] = {str(k): v for k, v in sorted(topology.allocated.items())}
    return json.dumps(doc, separators=(",", ":"))


def decode(text: str) -> GpuTopology:
    """Parse and validate an annotation value; raises :class:`TopologyError` naming the field.

    The checks run in document order, so the first fault in the document is the one named.
    """
    doc = _document(text)
    product = _product(doc.get("product"))
    gpus = _gpus(doc.get("gpus"))
    links = _links(doc.get("links"), len(gpus))
    _check_nvlink_within_islands(gpus, links)
    allocated = _allocated(doc.get("allocated", {}), len(gpus))
    return GpuTopology(gpus=gpus, links=links, allocated=allocated, product=product)


def _document(text: str) -> dict[str, Any]:
    """The JSON object of a version this module reads; refuses an oversized text unparsed."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_DOCUMENT_BYTES:
        raise TopologyError(f"document is larger than {MAX_DOCUMENT_BYTES} bytes")
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise TopologyError(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise TopologyError("document must be a JSON object")
    version = doc.get("version")
    if version != VERSION:
        raise TopologyError(f"version: expected {VERSION}, got {version!r}")
    return doc


def _product(raw: object) -> str | None:
    """The optional product name: absent, or a string."""
    if raw is None or isinstance(raw, str):
        return raw
    raise TopologyError("product: must be a string")


def _gpus(raw: object) -> tuple[Gpu, ...]:
    """Every GPU, sorted by index; the indices must be exactly 0..n-1."""
    if not isinstance(raw, list):
        raise TopologyError("gpus: must be a list")
    gpus = tuple(_gpu(i, entry) for i, entry in enumerate(raw))
    indices = [g.index for g in gpus]
    if sorted(indices) != list(range(len(gpus))):
        raise TopologyError(f"gpus: indices must be 0..{len(gpus) - 1} once each, got {indices}")
    return tuple(sorted(gpus, key=lambda g: g.index))


def _check_nvlink_within_islands(gpus: tuple[Gpu, ...], links: tuple[tuple[str, ...], ...]) -> None:
    """NVLink joins GPUs of one island only: a link across islands contradicts the islands."""
    for a in gpus:
        for b in gpus:
            joined = nvlink_count(links[a.index][b.index]) > 0
            if joined and a.island != b.island:
                raise TopologyError(
                    f"links[{a.index}][{b.index}]: NVLink between GPUs of islands "
                    f"{a.island} and {b.island}"
                )


def _allocated(raw: object, gpu_count: int) -> dict[int, str]:
    """GPU index -> the pod holding it; each key an index of this node, each pod named."""
    if not isinstance(raw, dict):
        raise TopologyError("allocated: must be an object of GPU index -> pod")
    allocated: dict[int, str] = {}
    for key, pod in raw.items():
        if not (isinstance(key, str) and key.isdecimal() and int(key) < gpu_count):
            raise TopologyError(f"allocated: {key!r} is not a GPU index of this node")
        if not isinstance(pod, str) or not pod:
            raise TopologyError(f"allocated[{key}]: must be a non-empty 'namespace/pod' string")
        allocated[int(key)] = pod
    return allocated


def _int(value: object, where: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TopologyError(f"{where}: must be an integer >= {minimum}, got {value!r}")
    return value


def _gpu(position: int, raw: object) -> Gpu:
    where = f"gpus[{position}]"
    if not isinstance(raw, dict):
        raise TopologyError(f"{where}: must be an object")
    uuid = raw.get("uuid")
    if not isinstance(uuid, str) or not uuid:
        raise TopologyError(f"{where}.uuid: must be a non-empty string")
    health = raw.get("health", "healthy")
    if not isinstance(health, str) or health not in HEALTH_VALUES:
        raise TopologyError(f"{where}.health: must be one of {sorted(HEALTH_VALUES)}")
    return Gpu(
        index=_int(raw.get("index"), f"{where}.index"),
        uuid=uuid,
        numa=_int(raw.get("numa", 0), f"{where}.numa", minimum=-1),
        health=cast(Health, health),
        island=_int(raw.get("island"), f"{where}.island"),
    )


def _links(raw: object, n: int) -> tuple[tuple[str, ...], ...]:
    if not isinstance(raw, list) or len(raw) != n:
        raise TopologyError(f"links: must be a list of {n} rows")
    rows: list[tuple[str, ...]] = []
    for i, row in enumerate(raw):
        if not isinstance(row, list) or len(row) != n:
            raise TopologyError(f"links[{i}]: must be a list of {n} levels")
        for j, level in enumerate(row):
            diagonal = i == j
            ok = isinstance(level, str) and (
                (diagonal and level == "X")
                or (not diagonal and (level in PCIE_LEVELS or _NVLINK.fullmatch(level)))
            )
            if not ok:
                expected = "'X'" if diagonal else "NV<n> or one of " + ", ".join(PCIE_LEVELS)
                raise TopologyError(f"links[{i}][{j}]: expected {expected}, got {level!r}")
        rows.append(tuple(row))
    for i in range(n):
        for j in range(n):
            if rows[i][j] != rows[j][i]:
                raise TopologyError(f"links[{i}][{j}]: matrix must be symmetric")
    return tuple(rows)
