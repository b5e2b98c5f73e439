"""The GPU monitor task: topology once NVML answers, then XID events as they come.

The state is one of ``starting``, ``ok``, ``absent: <why>`` (no library, no driver: retried
every minute) or ``error: <why>`` (NVML failed mid-read: started over). Every change of the
topology or of a GPU's health is handed to ``publish`` (the node annotation). A failed GPU held
by a pod (per PodResources) becomes a notice scoped to that pod, handed to ``on_faults``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import structlog

from contracts.gputopology import GpuTopology
from nodeagent.adapters.gpu import nvml
from nodeagent.adapters.gpu.xid import GpuHealth, XidPolicy
from nodeagent.core.events import EventId, Kind, Notice, PodKey

log = structlog.get_logger("nodeagent.adapters.gpu")

Publish = Callable[[GpuTopology], Awaitable[None]]
#: GPU UUID -> ``namespace/pod`` (the kubelet's PodResources API).
Owners = Callable[[], Awaitable[dict[str, str]]]
#: Receives the complete list of GPU-fault notices whenever it changes.
Faults = Callable[[Sequence[Notice]], None]


@dataclass(frozen=True, slots=True)
class GpuOptions:
    """How the agent watches its GPUs (``--gpu auto``): which XIDs fail a GPU, who holds each
    GPU (None: nobody is told of a GPU fault), how long a pod holding a failed GPU gets to leave,
    and how often things are read again."""

    policy: XidPolicy = field(default_factory=XidPolicy)
    owners: Owners | None = None
    fault_lead: timedelta = timedelta(seconds=30)
    owners_every: float = 5.0
    absent_retry: float = 60.0
    error_retry: float = 10.0


def fault_notices(
    topology: GpuTopology,
    failed_at: Mapping[int, datetime],
    last_xid: Mapping[int, int],
    lead: timedelta,
) -> list[Notice]:
    """A notice for each pod holding a failed GPU, scoped to that pod."""
    notices = []
    for gpu in topology.gpus:
        pod = topology.allocated.get(gpu.index)
        if gpu.health != "failed" or pod is None or gpu.index not in failed_at:
            continue
        xid = last_xid.get(gpu.index)
        notices.append(
            Notice(
                event_id=EventId(f"gpu-fault-{gpu.uuid}"),
                source="gpu",
                channel="gpu",
                kind=Kind.GPU_FAULT,
                deadline=failed_at[gpu.index] + lead,
                reason=f"GPU {gpu.index} ({gpu.uuid}) failed" + (f": XID {xid}" if xid else ""),
                scope=frozenset({PodKey(pod)}),
            )
        )
    return notices


class GpuMonitor:
    def __init__(
        self,
        publish: Publish,
        policy: XidPolicy | None = None,
        *,
        owners: Owners | None = None,
        owners_every: float = 5.0,
        on_faults: Faults | None = None,
        fault_lead: timedelta = timedelta(seconds=30),
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        absent_retry: float = 60.0,
        error_retry: float = 10.0,
    ) -> None:
        self.publish = publish
        self.owners = owners
        self.owners_every = owners_every
        self.on_faults = on_faults
        self.fault_lead = fault_lead
        self.clock = clock
        self.failed_at: dict[int, datetime] = {}
        self._faults: list[Notice] | None = None
        self.allocation = "not read" if owners is not None else "disabled"
        self._owners_at = 0.0
        self.health = GpuHealth(policy or XidPolicy())
        self.state = "starting"
        self.topology: GpuTopology | None = None
        self.heartbeat = time.monotonic()
        self.absent_retry = absent_retry
        self.error_retry = error_retry

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
                await asyncio.sleep(self.error_retry)
            except Exception as exc:
                # Not NVML's: the task guard logs it and starts the monitor over; until then
                # the state must not go on saying "ok", and NVML is not left initialised.
                self.state = f"error: {exc}"
                await asyncio.to_thread(nvml.shutdown)
                raise

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
        self._report_faults()
        watch = await asyncio.to_thread(nvml.XidWatch)
        try:
            while True:
                event = await asyncio.to_thread(watch.wait, 1000)
                self.heartbeat = time.monotonic()
                due = self.heartbeat - self._owners_at >= self.owners_every
                if due and await self._allocate() and self.topology is not None:
                    await self.publish(self.topology)
                    self._report_faults()
                if event is None:
                    continue
                changed = self.health.record(event.index, event.xid)
                health = self.health.by_index[event.index]
                if health == "failed":
                    self.failed_at.setdefault(event.index, self.clock())
                log.warning("gpu_xid", gpu=event.index, xid=event.xid, health=health)
                if changed and self.topology is not None:
                    gpus = tuple(
                        replace(g, health=self.health.by_index.get(g.index, g.health))
                        for g in self.topology.gpus
                    )
                    self.topology = replace(self.topology, gpus=gpus)
                    await self.publish(self.topology)
                    self._report_faults()
        finally:
            await asyncio.to_thread(watch.close)

    def _report_faults(self) -> None:
        if self.on_faults is None or self.topology is None:
            return
        notices = fault_notices(
            self.topology, self.failed_at, self.health.last_xid, self.fault_lead
        )
        if notices != self._faults:
            self._faults = notices
            self.on_faults(notices)

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
