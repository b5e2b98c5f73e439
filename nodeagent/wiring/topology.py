"""The GPU monitor's topology, on the node: ``shoal.dev/gpu-topology``, written only when its
text changed since the last write that succeeded (a failed write raises, and the next change
or restart of the monitor tries again)."""

from __future__ import annotations

from contracts import gputopology
from contracts.gputopology import GpuTopology
from nodeagent.adapters.calls import ApiCalls
from nodeagent.core.ports import ClusterPort


class TopologyWriter:
    """What the GPU monitor publishes through (:meth:`publish`)."""

    def __init__(self, cluster: ClusterPort, calls: ApiCalls) -> None:
        self._cluster = cluster
        self._calls = calls
        self._written: str | None = None

    async def publish(self, topology: GpuTopology) -> None:
        text = gputopology.encode(topology)
        if text != self._written:
            await self._calls.write(self._cluster.write_topology, text)
            self._written = text
