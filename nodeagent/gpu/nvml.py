"""NVML adapter: read the node's GPU topology, and wait for XID events (blocking, threads).

Islands: GPUs joined by NVLink, directly or through NVSwitch (on HGX baseboards every GPU's
links end at the switches, so the whole baseboard is one island — counting GPU peers by bus id
alone would miss that). Link levels between two GPUs: ``NV<n>`` for ``n`` direct links (or the
smaller of their switch link counts), else the PCIe level of their common ancestor.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
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


def read_topology(health: Mapping[int, Health]) -> GpuTopology:
    """The node's GPUs as the ``shoal.dev/gpu-topology`` document describes them."""
    count = pynvml.nvmlDeviceGetCount()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    bus_ids = [_text(pynvml.nvmlDeviceGetPciInfo(h).busId).lower() for h in handles]
    by_bus = {bus: i for i, bus in enumerate(bus_ids)}
    direct: dict[tuple[int, int], int] = {}
    to_switch = [0] * count
    for i, handle in enumerate(handles):
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                    continue
                kind = pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
                if kind == _SWITCH:
                    to_switch[i] += 1
                elif kind == _GPU:
                    remote = _text(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
                    peer = by_bus.get(remote.lower())
                    # Each side reports the same links: count them from the lower index only.
                    if peer is not None and peer > i:
                        direct[(i, peer)] = direct.get((i, peer), 0) + 1
            except pynvml.NVMLError:
                # Absent links answer NotSupported / InvalidArgument: no more links here.
                break
    islands = _Islands(count)
    for a, b in direct:
        islands.join(a, b)
    switched = [i for i in range(count) if to_switch[i]]
    for i in switched[1:]:
        islands.join(switched[0], i)
    roots: dict[int, int] = {}
    gpus = []
    for i, handle in enumerate(handles):
        try:
            numa = int(pynvml.nvmlDeviceGetNumaNodeId(handle))
        except pynvml.NVMLError:
            numa = -1
        root = islands.find(i)
        gpus.append(
            Gpu(
                index=i,
                uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                numa=max(numa, -1),
                health=health.get(i, "healthy"),
                island=roots.setdefault(root, len(roots)),
            )
        )
    links: list[tuple[str, ...]] = []
    for a in range(count):
        row = []
        for b in range(count):
            if a == b:
                row.append("X")
                continue
            n = direct.get((min(a, b), max(a, b)), 0)
            if not n and to_switch[a] and to_switch[b]:
                n = min(to_switch[a], to_switch[b])
            if n:
                row.append(f"NV{n}")
            else:
                level = pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b])
                row.append(_PCIE_LEVELS.get(int(level), "SYS"))
        links.append(tuple(row))
    product = _text(pynvml.nvmlDeviceGetName(handles[0])) if handles else None
    return GpuTopology(gpus=tuple(gpus), links=tuple(links), product=product)


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
