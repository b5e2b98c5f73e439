"""The GPU monitor task: topology once NVML answers, then XID events as they come.

The state is one of ``starting``, ``ok``, ``absent: <why>`` (no library, no driver: retried
every minute) or ``error: <why>`` (NVML failed mid-read: started over). Every change of the
topology or of a GPU's health is handed to ``publish`` (the node annotation).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

import structlog

from contracts.gputopology import GpuTopology
from nodeagent.gpu import nvml
from nodeagent.gpu.xid import GpuHealth, XidPolicy

log = structlog.get_logger("nodeagent.gpu")

Publish = Callable[[GpuTopology], Awaitable[None]]
#: GPU UUID -> ``namespace/pod`` (the kubelet's PodResources API).
Owners = Callable[[], Awaitable[dict[str, str]]]


class GpuMonitor:
    def __init__(
        self,
        publish: Publish,
        policy: XidPolicy | None = None,
        *,
        owners: Owners | None = None,
        owners_every: float = 5.0,
        absent_retry: float = 60.0,
    ) -> None:
        self.publish = publish
        self.owners = owners
        self.owners_every = owners_every
        self.allocation = "not read" if owners is not None else "disabled"
        self._owners_at = 0.0
        self.health = GpuHealth(policy or XidPolicy())
        self.state = "starting"
        self.topology: GpuTopology | None = None
        self.heartbeat = time.monotonic()
        self.absent_retry = absent_retry

    async def run(self) -> None:
        while True:
            try:
                await asyncio.to_thread(nvml.init)
            except nvml.NvmlUnavailable as exc:
                if not self.state.startswith("absent"):
                    log.warning("gpu_absent", reason=str(exc))
                self.state = f"absent: {exc}"
                self.heartbeat = time.monotonic()
                await asyncio.sleep(self.absent_retry)
                continue
            try:
                await self._watch()
            except nvml.NvmlFault as exc:
                log.warning("gpu_error", error=str(exc))
                self.state = f"error: {exc}"
                await asyncio.to_thread(nvml.shutdown)
                await asyncio.sleep(10.0)

    async def _watch(self) -> None:
        self.topology = await asyncio.to_thread(nvml.topology, dict(self.health.by_index))
        self.state = "ok"
        log.info(
            "gpu_topology",
            gpus=len(self.topology.gpus),
            islands=sorted(len(m) for m in self.topology.islands().values()),
            product=self.topology.product,
        )
        await self._allocate()
        await self.publish(self.topology)
        watch = await asyncio.to_thread(nvml.XidWatch)
        try:
            while True:
                event = await asyncio.to_thread(watch.wait, 1000)
                self.heartbeat = time.monotonic()
                due = self.heartbeat - self._owners_at >= self.owners_every
                if due and await self._allocate() and self.topology is not None:
                    await self.publish(self.topology)
                if event is None:
                    continue
                changed = self.health.record(event.index, event.xid)
                health = self.health.by_index[event.index]
                log.warning("gpu_xid", gpu=event.index, xid=event.xid, health=health)
                if changed and self.topology is not None:
                    gpus = tuple(
                        replace(g, health=self.health.by_index.get(g.index, g.health))
                        for g in self.topology.gpus
                    )
                    self.topology = replace(self.topology, gpus=gpus)
                    await self.publish(self.topology)
        finally:
            await asyncio.to_thread(watch.close)

    async def _allocate(self) -> bool:
        """Read which pod holds which GPU; True when the topology's allocation changed."""
        if self.owners is None or self.topology is None:
            return False
        self._owners_at = time.monotonic()
        try:
            owners = await self.owners()
        except Exception as exc:
            if not self.allocation.startswith("unknown"):
                log.warning("gpu_allocation_unknown", error=str(exc))
            self.allocation = f"unknown: {exc}"
            return False
        self.allocation = "ok"
        index = {g.uuid: g.index for g in self.topology.gpus}
        allocated = {index[uuid]: pod for uuid, pod in owners.items() if uuid in index}
        if allocated == dict(self.topology.allocated):
            return False
        self.topology = replace(self.topology, allocated=allocated)
        return True

    def report(self) -> dict[str, object]:
        return {
            "state": self.state,
            "allocation": self.allocation,
            "allocated": (
                {str(i): p for i, p in sorted(self.topology.allocated.items())}
                if self.topology
                else {}
            ),
            "gpus": len(self.topology.gpus) if self.topology else 0,
            "islands": (
                sorted(len(m) for m in self.topology.islands().values()) if self.topology else []
            ),
            "health": {str(i): h for i, h in sorted(self.health.by_index.items())},
            "last_xid": {str(i): x for i, x in sorted(self.health.last_xid.items())},
        }
