"""The interfaces between the agent's rooms and its adapters (Protocols), in the core so that
each side depends on them and not on the other.

:class:`Board` is what the notice socket's service asks of the agent (who a caller is, its
notice, its acknowledgement); :class:`NoticeWatches` is what the notice board tells the workers
through (the open watches of each pod). The wiring (``nodeagent/wiring/agent.py``) creates the
board, the watches and the service, and hands each only its side.
"""

from __future__ import annotations

from typing import Protocol

from nodeagent.core.events import Notice, PodKey, PodUid
from nodeagent.core.store import AckOutcome


class Board(Protocol):
    """What the notice socket's service needs from the agent."""

    async def identify(self, key: PodKey, uid: PodUid) -> bool:
        """True when the pod is bound to this node with this uid (may refresh the pod list)."""

    def notice_for(self, uid: PodUid) -> Notice | None:
        """The notice the pod is under, if any."""

    def watching(self, uid: PodUid) -> None:
        """The pod opened a watch: it is a training worker."""

    async def acknowledge(self, key: PodKey, uid: PodUid, step: int) -> AckOutcome:
        """The pod's workers checkpointed at ``step``."""


class NoticeWatches(Protocol):
    """The workers' open watches, as the notice board sees them."""

    def publish(self, uid: PodUid, notice: Notice | None, *, withdrawn: bool = False) -> int:
        """Send ``notice`` (or none, ``withdrawn`` or not) to every open watch of the pod;
        returns how many received it."""

    def watchers(self) -> int:
        """How many watches are open."""
