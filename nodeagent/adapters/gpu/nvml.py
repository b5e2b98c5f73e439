"""NVML adapter: read the node's GPU topology, and wait for XID events (blocking, threads).

Islands: GPUs joined by NVLink, directly or through NVSwitch (on HGX baseboards every GPU's
links end at the switches, so the whole baseboard is one island — counting GPU peers by bus id
alone would miss that). Link levels between two GPUs: ``NV<n>`` for ``n`` direct links (or the
smaller of their switch link counts), else the PCIe level of their common ancestor.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from ctypes import c_void_p, cast
from dataclasses import dataclass
from typing import Any, Final

import pynvml

from contracts.gputopology import Gpu, GpuTopology, Health

_PCIE_LEVELS: Final = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_SWITCH: Final = 2
_GPU: Final = 0


class NvmlUnavailable(Exception):
    """No library, no driver, or no permission: a state to report, not a fault to crash on."""


@dataclass(frozen=True, slots=True)
class XidEvent:
    index: int
    xid: int


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlFault(Exception):
    """NVML answered with an error in the middle of a read (the monitor starts over)."""


def init() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML: {exc}") from exc


def topology(health: Mapping[int, Health]) -> GpuTopology:
    """:func:`read_topology` with NVML's errors as :class:`NvmlFault`."""
    try:
        return read_topology(health)
    except pynvml.NVMLError as exc:
        raise NvmlFault(f"NVML: {exc}") from exc


def shutdown() -> None:
    with contextlib.suppress(pynvml.NVMLError):
        pynvml.nvmlShutdown()


class _Islands:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def join(self, a: int, b: int) -> None:
        self.parent[self.find(a)] = self.find(b)


@dataclass(slots=True)
class _NvLinks:
    """NVLinks as NVML reports them: between two GPUs (``direct``, keyed by the lower index
    first) and from each GPU to an NVSwitch (``to_switch``)."""

    direct: dict[tuple[int, int], int]
    to_switch: list[int]

    def between(self, a: int, b: int) -> int:
        """Links between GPUs ``a`` and ``b``: direct ones, else through the switches."""
        n = self.direct.get((min(a, b), max(a, b)), 0)
        if not n and self.to_switch[a] and self.to_switch[b]:
            n = min(self.to_switch[a], self.to_switch[b])
        return n

    def islands(self) -> _Islands:
        """GPUs joined by NVLink, directly or through the switches."""
        islands = _Islands(len(self.to_switch))
        for a, b in self.direct:
            islands.join(a, b)
        switched = [i for i, n in enumerate(self.to_switch) if n]
        for i in switched[1:]:
            islands.join(switched[0], i)
        return islands


def _read_links(handles: Sequence[Any], bus_ids: Sequence[str]) -> _NvLinks:
    by_bus = {bus: i for i, bus in enumerate(bus_ids)}
    links = _NvLinks(direct={}, to_switch=[0] * len(handles))
    for i, handle in enumerate(handles):
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                _read_link(links, i, handle, link, by_bus)
            except pynvml.NVMLError:
                # Absent links answer NotSupported / InvalidArgument: no more links here.
                break
    return links


def _read_link(links: _NvLinks, i: int, handle: Any, link: int, by_bus: dict[str, int]) -> None:
    if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
        return
    kind = pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
    if kind == _SWITCH:
        links.to_switch[i] += 1
    elif kind == _GPU:
        remote = _text(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
        peer = by_bus.get(remote.lower())
        # Each side reports the same links: count them from the lower index only.
        if peer is not None and peer > i:
            links.direct[(i, peer)] = links.direct.get((i, peer), 0) + 1


def _numa(handle: Any) -> int:
    try:
        return max(int(pynvml.nvmlDeviceGetNumaNodeId(handle)), -1)
    except pynvml.NVMLError:
        return -1


def _gpus(
    handles: Sequence[Any], islands: _Islands, health: Mapping[int, Health]
) -> tuple[Gpu, ...]:
    """Each GPU, its islands numbered in order of their first GPU."""
    roots: dict[int, int] = {}
    return tuple(
        Gpu(
            index=i,
            uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
            numa=_numa(handle),
            health=health.get(i, "healthy"),
            island=roots.setdefault(islands.find(i), len(roots)),
        )
        for i, handle in enumerate(handles)
    )


def _link_matrix(handles: Sequence[Any], links: _NvLinks) -> tuple[tuple[str, ...], ...]:
    """``nvidia-smi topo -m``: ``X`` on the diagonal, ``NV<n>`` or the PCIe level elsewhere."""

    def cell(a: int, b: int) -> str:
        if a == b:
            return "X"
        n = links.between(a, b)
        if n:
            return f"NV{n}"
        level = pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b])
        return _PCIE_LEVELS.get(int(level), "SYS")

    count = len(handles)
    return tuple(tuple(cell(a, b) for b in range(count)) for a in range(count))


def read_topology(health: Mapping[int, Health]) -> GpuTopology:
    """The node's GPUs as the ``shoal.dev/gpu-topology`` document describes them."""
    count = pynvml.nvmlDeviceGetCount()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    bus_ids = [_text(pynvml.nvmlDeviceGetPciInfo(h).busId).lower() for h in handles]
    links = _read_links(handles, bus_ids)
    gpus = _gpus(handles, links.islands(), health)
    product = _text(pynvml.nvmlDeviceGetName(handles[0])) if handles else None
    return GpuTopology(gpus=gpus, links=_link_matrix(handles, links), product=product)


class XidWatch:
    """Blocking XID event wait, to run in a worker thread."""

    def __init__(self) -> None:
        try:
            self._register()
        except pynvml.NVMLError as exc:
            # Like every other NVML failure mid-run: the monitor starts over.
            raise NvmlFault(f"NVML event registration: {exc}") from exc

    def _register(self) -> None:
        count = pynvml.nvmlDeviceGetCount()
        self._set = pynvml.nvmlEventSetCreate()
        self._index: dict[int, int] = {}
        for i in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            self._index[_address(handle)] = i
            try:
                pynvml.nvmlDeviceRegisterEvents(
                    handle, pynvml.nvmlEventTypeXidCriticalError, self._set
                )
            except pynvml.NVMLError:
                continue  # e.g. NotSupported on this GPU: health from XIDs is then unknown

    def wait(self, timeout_ms: int) -> XidEvent | None:
        try:
            data = pynvml.nvmlEventSetWait_v2(self._set, timeout_ms)
        except pynvml.NVMLError as exc:
            if getattr(exc, "value", None) == pynvml.NVML_ERROR_TIMEOUT:
                return None
            raise NvmlFault(f"NVML event wait: {exc}") from exc
        if data.eventType != pynvml.nvmlEventTypeXidCriticalError:
            return None
        index = self._index.get(_address(data.device))
        if index is None:
            return None
        return XidEvent(index=index, xid=int(data.eventData))

    def close(self) -> None:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlEventSetFree(self._set)


def _address(handle: Any) -> int:
    """The device a handle points at (event data carries a handle equal to, not the same
    Python object as, the one from ``nvmlDeviceGetHandleByIndex``)."""
    return int(cast(handle, c_void_p).value or 0)
