"""The interfaces between the agent's rooms and its adapters (Protocols), in the core so that
each side depends on them and not on the other.

- :class:`Board` is what the notice socket's service asks of the agent (who a caller is, its
  notice, its acknowledgement); :class:`NoticeWatches` is what the notice board tells the
  workers through (the open watches of each pod). The wiring (``nodeagent/wiring/agent.py``)
  creates the board, the watches and the service, and hands each only its side.
- :class:`ClusterPort` is the Kubernetes calls the rooms make (the adapter:
  :class:`nodeagent.adapters.k8s.Cluster`); :class:`Feed` is one kind of object listed then
  watched, each :class:`Change` handed to whoever follows it.
- :class:`Provider` is one cloud's revocation monitor, reporting to a :class:`Sink` (and
  failing with a :class:`ProviderError`, the root of the providers' error tree);
  :class:`Reader` is who reads a metadata channel (a provider), :class:`GpuView` what the
  reports show of the GPU monitor, :class:`NoticeSocket` whether new workers can reach the
  notice socket.

No room creates what calls back into it: a room that follows a feed hands the follower its hooks
(:mod:`nodeagent.adapters.follow`), and the agent creates the rooms and hands each the ports of
the others.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from nodeagent.core.events import Notice, Pod, PodKey, PodUid, Tracked
from nodeagent.core.store import AckOutcome

T = TypeVar("T")


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


class ClusterPort(Protocol):
    """The Kubernetes calls the agent makes (see :class:`nodeagent.adapters.k8s.Cluster`);
    blocking."""

    last_ok: float
    dry_run: bool

    def read_revocation(self) -> list[Tracked]: ...
    def list_pods(self) -> list[Pod]: ...
    def sync_node(self, tracked: Sequence[Tracked]) -> None: ...
    def annotate_pod(self, pod: Pod, notice: Notice) -> bool: ...
    def annotate_progress(self, pod: Pod, text: str) -> bool: ...
    def clear_pod(self, pod: Pod) -> bool: ...
    def warn_pod(self, pod: Pod, reason: str, message: str) -> None: ...
    def evict(self, pod: Pod, reason: str) -> bool: ...
    def delete(self, pod: Pod, grace_seconds: int) -> bool: ...
    def write_topology(self, text: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Change(Generic[T]):
    """One change a watch saw: ``item`` added or changed, or ``gone`` (deleted; for a pod also
    finished, since a pod list leaves out pods that succeeded or failed); ``item`` is None for a
    bookmark. Each carries the watch's ``version`` to resume from."""

    item: T | None
    gone: bool
    version: str


#: A change to one of this node's pods (for annotations: a slotted generic alias cannot be called).
PodChange = Change[Pod]


class Feed(Protocol[T]):
    """Objects of one kind, listed then watched through a field selector (this node's pods, the
    Node itself, the Events of a reason; see :mod:`nodeagent.adapters.k8s.cluster`); blocking."""

    def list_at(self) -> tuple[list[T], str]:
        """The objects and the version of the list (to watch from)."""

    def watch(self, version: str, timeout: int) -> Iterator[Change[T]]:
        """Each change after ``version`` until the server ends the watch (after ``timeout``
        seconds) or :meth:`stop_watch`, after an empty change (no item, no version) once the
        server has answered; raises :class:`nodeagent.adapters.calls.WatchExpired` when
        ``version`` is too old, another exception when the API server cannot be reached or the
        watch breaks."""

    def stop_watch(self) -> None:
        """End the watch under way, from another thread."""


class Reader(Protocol):
    """Who reads a channel (a provider)."""

    @property
    def name(self) -> str: ...

    def stale_after(self) -> float:
        """Seconds without a successful read after which the channel counts as unreachable."""


class GpuView(Protocol):
    """What the reports show of the GPU monitor
    (:class:`nodeagent.adapters.gpu.monitor.GpuMonitor`)."""

    state: str
    allocation: str

    def report(self) -> dict[str, object]: ...


class NoticeSocket(Protocol):
    """The notice socket (:class:`nodeagent.notify.server.NoticeServer`): whether new workers
    can connect to it, and why not."""

    def live(self) -> tuple[bool, dict[str, Any]]: ...


class ProviderError(Exception):
    """A metadata read failed; ``kind`` labels the metric. The root of the providers' error
    tree (:mod:`nodeagent.adapters.providers.base`): what a :class:`Provider` reports and
    raises."""

    kind: ClassVar[str] = "error"


class Sink(Protocol):
    """Where providers report. Both calls must be cheap and must not raise."""

    def observed(self, channel: str, notices: Sequence[Notice]) -> None:
        """A complete, successful read of ``channel``: exactly these notices are live."""

    def failed(self, channel: str, error: ProviderError) -> None:
        """A read of ``channel`` failed; what was live before is still live."""


class Provider(Protocol):
    """One cloud's revocation monitor."""

    name: str

    async def watch(self, sink: Sink) -> None:
        """Read the metadata server until cancelled; never raises anything else."""

    def stale_after(self) -> float:
        """Seconds without a successful read after which the metadata counts as unreachable."""

    async def acknowledge(self, notice: Notice) -> None:
        """Tell the cloud it may go ahead (no-op where the cloud has no such call).

        Raises :class:`ProviderError` when the cloud did not take the acknowledgement.
        """

    async def aclose(self) -> None:
        """Release connections."""
