"""Where gangs come from: one :class:`GangSource` per way of saying "these pods go together",
asked in the order of :data:`SOURCES`; the first that claims a pod decides its gang, except
that a pod claimed by two PodGroup sources (:data:`GROUP_SOURCES`) waits in a gang of its own
that is never valid, its message naming the claims.

A new source (Kubernetes' own ``scheduling.k8s.io`` PodGroup, Volcano's PodGroup) is one new
module here with a ``claims`` and a ``build``, and one entry in :data:`SOURCES`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from contracts import names
from scheduler.gang.sources.common import GangRef
from scheduler.gang.sources.conflict import ConflictSource, conflict_ref
from scheduler.gang.sources.kubernetes import KubernetesSource
from scheduler.gang.sources.label import LabelSource
from scheduler.gang.sources.pod_group import PodGroupSource
from scheduler.gang.sources.single import SinglePodSource
from scheduler.gang.sources.volcano import VolcanoSource
from scheduler.model import Gang, GangKey, InvalidGang, PodGroup, PodRequest


class GangSource(Protocol):
    def claims(self, pod: PodRequest) -> GangRef | None:
        """The pod's gang under this source, or ``None`` when the pod does not use it."""

    def build(
        self, key: GangKey, pods: Sequence[PodRequest], groups: Mapping[str, PodGroup]
    ) -> Gang | InvalidGang:
        """The gang ``key`` of ``pods``: its live members, oldest first, all of them for this
        scheduler, at least one. ``groups`` maps ``namespace/name`` to the PodGroups there
        are. Wrong input is an :class:`InvalidGang` whose message names the field."""


#: The sources whose gangs are defined by a PodGroup object: a pod that more than one of them
#: claims is in no gang until it names one.
GROUP_SOURCES: tuple[GangSource, ...] = (PodGroupSource(), VolcanoSource())

#: Asked in this order: a PodGroup named by label or annotation wins over a ``shoal.dev/gang``
#: label, which wins over ``spec.schedulingGroup`` (a Job controller sets that on its own, with
#: WorkloadWithJob, where the pods' labels say what the user meant); a pod that none of the
#: others claims is a gang of one (the last source claims every pod).
SOURCES: tuple[GangSource, ...] = (
    *GROUP_SOURCES,
    LabelSource(),
    KubernetesSource(),
    SinglePodSource(),
)

#: How each source's claim is named in messages (what on the pod made the claim).
_HOW: dict[type, str] = {
    PodGroupSource: f"label {names.POD_GROUP_LABEL}",
    VolcanoSource: f"annotation {names.VOLCANO_GROUP_ANNOTATION}",
}


def claim(pod: PodRequest) -> tuple[GangSource, GangRef]:
    """The source that claims ``pod`` and its reference to the pod's gang: the one PodGroup
    source that does, a :class:`ConflictSource` when several do, else the first other source
    that does."""
    found: list[tuple[GangSource, GangRef]] = []
    for source in GROUP_SOURCES:
        ref = source.claims(pod)
        if ref is not None:
            found.append((source, ref))
    if len(found) > 1:
        text = tuple(f"{_HOW.get(type(s), type(s).__name__)}: gang {r.key}" for s, r in found)
        return ConflictSource(text), conflict_ref(pod)
    if found:
        return found[0]
    for source in SOURCES[len(GROUP_SOURCES) :]:
        ref = source.claims(pod)
        if ref is not None:
            return source, ref
    raise AssertionError("the last gang source claims every pod")


__all__ = ["GROUP_SOURCES", "SOURCES", "GangRef", "GangSource", "claim"]
