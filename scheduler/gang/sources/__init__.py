"""Where gangs come from: one :class:`GangSource` per way of saying "these pods go together",
asked in the order of :func:`sources`; the first that claims a pod decides its gang, except
that a pod claimed by two PodGroup kinds (:attr:`~scheduler.gang.kinds.Kinds.first`) or by a
source in :data:`NAMED` and any other source but a gang of one waits in a gang of its own that
is never valid, its message naming the claims.

Every PodGroup kind is a source (:mod:`scheduler.gang.kinds`: a new kind is one module there and
one entry in its table); the others are here: the gangs another system names on its pods
without an object behind them (:data:`NAMED`: Kueue's pod groups, ``kueue``; a new one is one
module here and one entry there), the ``shoal.dev/gang`` label (``label``), a pod two sources
claim (``conflict``) and a gang of one (``single``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from contracts import names
from scheduler.gang.common import GangRef
from scheduler.gang.kinds import KINDS, Kinds
from scheduler.gang.kinds.base import Claim
from scheduler.gang.sources.conflict import ConflictSource, conflict_ref
from scheduler.gang.sources.kueue import KueuePodGroup
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


class NamedSource(GangSource, Protocol):
    """A gang source a pod opts into by naming its gang, as it names a PodGroup, where no
    object stands behind the name (the pods alone say what the gang is)."""

    @property
    def claim(self) -> Claim:
        """What on a pod names the gang, in words (``text``) and read (``read``)."""

    @property
    def tag(self) -> str:
        """The middle of its gang keys (``namespace/<tag>:name``), and what ``kubectl shoal``
        calls the source."""


#: The named sources, one module each: asked with the PodGroup kinds named by label or
#: annotation, before the ``shoal.dev/gang`` label; a pod one of them claims that another of
#: those or the label also claims waits, naming both.
NAMED: tuple[NamedSource, ...] = (KueuePodGroup(),)

_LABEL = LabelSource()
_SINGLE = SinglePodSource()


def sources(kinds: Kinds = KINDS) -> tuple[GangSource, ...]:
    """Asked in this order: a PodGroup named by label or annotation wins over a
    ``shoal.dev/gang`` label, which wins over the kinds asked after it (a field a controller
    sets on its own, where the pods' labels say what the user meant); a named source
    (:data:`NAMED`) is asked with the first, and a pod it claims with the label waits; a pod
    that none of the others claims is a gang of one (the last source claims every pod)."""
    return (*kinds.first, *NAMED, _LABEL, *kinds.after_label, _SINGLE)


def claim(pod: PodRequest, kinds: Kinds = KINDS) -> tuple[GangSource, GangRef]:
    """The source that claims ``pod`` and its reference to the pod's gang: the one PodGroup
    kind asked first or named source that does, a :class:`ConflictSource` when several do (or
    a named source and the ``shoal.dev/gang`` label), else the first other source that does."""
    found: list[tuple[str, GangSource, GangRef]] = [
        (kind.claim.text, kind, ref)
        for kind in kinds.first
        if (ref := kind.claims(pod)) is not None
    ]
    named = [(s.claim.text, s, ref) for s in NAMED if (ref := s.claims(pod)) is not None]
    found += named
    if named and (label := _LABEL.claims(pod)) is not None:
        found.append((f"label {names.GANG_LABEL}", _LABEL, label))
    if len(found) > 1:
        text = tuple(f"{said}: gang {ref.key}" for said, _, ref in found)
        return ConflictSource(text), conflict_ref(pod)
    if found:
        _, source, ref = found[0]
        return source, ref
    rest: tuple[GangSource, ...] = (_LABEL, *kinds.after_label, _SINGLE)
    for source in rest:
        claimed = source.claims(pod)
        if claimed is not None:
            return source, claimed
    raise AssertionError("the last gang source claims every pod")


__all__ = ["NAMED", "GangRef", "GangSource", "NamedSource", "claim", "sources"]
