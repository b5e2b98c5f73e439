"""What an XID means for a GPU's health. Pure and configurable.

Defaults follow NVIDIA's XID catalog resolutions: XIDs that only concern the application that
hit them (13, 31, 43, 45, 68, 109 — what the device plugin also ignores) leave the GPU healthy;
XIDs whose resolution is a GPU reset or replacement mark it failed; anything else unknown marks
it degraded, so the scheduler prefers other GPUs without the agent guessing more than it knows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from contracts.gputopology import Health

APPLICATION_XIDS: Final = frozenset({13, 31, 43, 45, 68, 109})
#: Double-bit ECC, row-remap failure, NVLink fatal, fallen off the bus, uncontained ECC, GSP
#: errors, and the like: the GPU needs a reset or replacing.
FATAL_XIDS: Final = frozenset(
    {48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 121, 123, 136, 140, 143, 154}
)


@dataclass(frozen=True, slots=True)
class XidPolicy:
    ignore: frozenset[int] = APPLICATION_XIDS
    fatal: frozenset[int] = FATAL_XIDS
    #: Health for XIDs in neither set.
    otherwise: Health = "degraded"

    def health(self, xid: int) -> Health:
        if xid in self.ignore:
            return "healthy"
        if xid in self.fatal:
            return "failed"
        return self.otherwise


_ORDER: Final[dict[Health, int]] = {"healthy": 0, "degraded": 1, "failed": 2}


def worse(a: Health, b: Health) -> Health:
    """Health is sticky until the agent restarts (a reset GPU comes back with a new agent)."""
    return a if _ORDER[a] >= _ORDER[b] else b


@dataclass(slots=True)
class GpuHealth:
    policy: XidPolicy = field(default_factory=XidPolicy)
    by_index: dict[int, Health] = field(default_factory=dict)
    last_xid: dict[int, int] = field(default_factory=dict)

    def record(self, index: int, xid: int) -> bool:
        """Apply one XID; True when the GPU's health changed."""
        before = self.by_index.get(index, "healthy")
        after = worse(before, self.policy.health(xid))
        self.last_xid[index] = xid
        self.by_index[index] = after
        return after != before
