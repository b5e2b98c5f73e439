"""Where gangs come from: one :class:`GangSource` per way of saying "these pods go together",
asked in the order of :func:`sources`; the first that claims a pod decides its gang, except
that a pod claimed by two PodGroup kinds (:attr:`~scheduler.gang.kinds.Kinds.first`) waits in a
gang of its own that is never valid, its message naming the claims.

Every PodGroup kind is a source (:mod:`scheduler.gang.kinds`: a new kind is one module there and
one entry in its table); the others are here: the ``shoal.dev/gang`` label (``label``), a pod
two kinds claim (``conflict``) and a gang of one (``single``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from scheduler.gang.common import GangRef
from scheduler.gang.kinds import KINDS, Kinds
from scheduler.gang.sources.conflict import ConflictSource, conflict_ref
from scheduler.gang.sources.label import LabelSource
from scheduler.gang.sources.single import SinglePodSource
from scheduler.model import Gang, GangKey, InvalidGang, PodGroup, PodRequest


class GangSource(Protocol):
    def claims(self, pod: PodRequest) -> GangRef | None:
        """The pod's gang under this source, or ``None`` when the pod does not use it."""

    def build(
        self, key: GangKey, pods: Sequence[PodRequest], groups: Mapping[str, PodGroup]
    ) -> Gang | InvalidGang:
        """The gang ``key`` of ``pods``: its live members, oldest first, all of them for this
        scheduler, at least one. ``groups`` maps group references to the PodGroups there
        are. Wrong input is an :class:`InvalidGang` whose message names the field."""


_LABEL = LabelSource()
_SINGLE = SinglePodSource()


def sources(kinds: Kinds = KINDS) -> tuple[GangSource, ...]:
    """Asked in this order: a PodGroup named by label or annotation wins over a
    ``shoal.dev/gang`` label, which wins over the kinds asked after it (a field a controller
    sets on its own, where the pods' labels say what the user meant); a pod that none of the
    others claims is a gang of one (the last source claims every pod)."""
    return (*kinds.first, _LABEL, *kinds.after_label, _SINGLE)


def claim(pod: PodRequest, kinds: Kinds = KINDS) -> tuple[GangSource, GangRef]:
    """The source that claims ``pod`` and its reference to the pod's gang: the one PodGroup
    kind asked first that does, a :class:`ConflictSource` when several do, else the first
    other source that does."""
    found = [(kind, ref) for kind in kinds.first if (ref := kind.claims(pod)) is not None]
    if len(found) > 1:
        text = tuple(f"{kind.claim.text}: gang {ref.key}" for kind, ref in found)
        return ConflictSource(text), conflict_ref(pod)
    if found:
        return found[0]
    rest: tuple[GangSource, ...] = (_LABEL, *kinds.after_label, _SINGLE)
    for source in rest:
        claimed = source.claims(pod)
        if claimed is not None:
            return source, claimed
    raise AssertionError("the last gang source claims every pod")


__all__ = ["GangRef", "GangSource", "claim", "sources"]
