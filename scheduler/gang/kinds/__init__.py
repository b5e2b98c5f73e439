"""The PodGroup kinds: one module each (:class:`~scheduler.gang.kinds.base.PodGroupKind`), and
:data:`KINDS`, the table that the gang sources, the informers, the status writer, the runner and
``kubectl shoal`` all read. A new kind is one new module here and one entry in :data:`KINDS`.

- ``scheduler_plugins``: ``scheduling.x-k8s.io``, label ``scheduling.x-k8s.io/pod-group``;
- ``volcano``: ``scheduling.volcano.sh``, annotation ``scheduling.k8s.io/group-name``;
- ``kubernetes``: ``scheduling.k8s.io``, ``spec.schedulingGroup.podGroupName``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from scheduler.gang.kinds.base import (
    Api,
    ConditionPatch,
    GroupWrite,
    PodGroupKind,
    StatusPatch,
)
from scheduler.gang.kinds.kubernetes import Kubernetes
from scheduler.gang.kinds.scheduler_plugins import SchedulerPlugins
from scheduler.gang.kinds.volcano import Volcano
from scheduler.model import PodGroup, split_group_ref


@dataclass(frozen=True, slots=True)
class Kinds:
    """A table of PodGroup kinds, each with its own tag; asked in this order for a pod's
    claim."""

    kinds: tuple[PodGroupKind, ...]

    def __iter__(self) -> Iterator[PodGroupKind]:
        return iter(self.kinds)

    def __post_init__(self) -> None:
        tags = [k.tag for k in self.kinds]
        if len(set(tags)) != len(tags):
            raise ValueError(f"two PodGroup kinds share a tag: {tags}")

    def tagged(self, tag: str) -> PodGroupKind:
        """The kind whose references carry ``tag``."""
        for kind in self.kinds:
            if kind.tag == tag:
                return kind
        raise KeyError(f"no PodGroup kind is tagged {tag!r}")

    def of_ref(self, ref: str) -> PodGroupKind:
        """The kind of the PodGroup reference ``ref``."""
        return self.tagged(split_group_ref(ref)[0])

    def of(self, group: PodGroup) -> PodGroupKind:
        return self.tagged(group.kind)

    @property
    def first(self) -> tuple[PodGroupKind, ...]:
        """The kinds asked before the ``shoal.dev/gang`` label; a pod two of them claim waits."""
        return tuple(k for k in self.kinds if not k.after_label)

    @property
    def after_label(self) -> tuple[PodGroupKind, ...]:
        return tuple(k for k in self.kinds if k.after_label)


#: Every PodGroup kind Shoal reads.
KINDS = Kinds(
    (
        SchedulerPlugins(),
        Volcano(),
        Kubernetes(),
    )
)

__all__ = [
    "KINDS",
    "Api",
    "ConditionPatch",
    "GroupWrite",
    "Kinds",
    "PodGroupKind",
    "StatusPatch",
]
