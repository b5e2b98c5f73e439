"""Free capacity per topology domain, kept up to date as nodes change instead of summed per
decision.

A domain is one value of one topology label (``shoal.dev/rack=rack-3``, a zone, a block). For
each label it tracks, :class:`DomainIndex` (owned by the cache) keeps the nodes carrying each
value and the sum of their ``free``; a node whose state changes moves its old contribution out
and its new one in, so the cost is per changed node, not per node. A snapshot holds an immutable
:class:`Domains` copy; a snapshot derived inside a cycle (bindings, room held, pods gone) gets
one with just the touched nodes moved (:meth:`Domains.moved`).

The placement search ranks domains by the free capacity of the nodes a gang can use: the total
here minus what the few nodes it cannot use hold (see :mod:`scheduler.placement.search`).
Invariant (checked by the unit tests after random operations): for every tracked key and value,
``free`` is the sum of ``NodeState.free`` over the snapshot's nodes with that label value, and
``members`` is exactly those nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduler.model import NodeName, NodeState, Resources


@dataclass(frozen=True, slots=True)
class Domain:
    """The nodes with one value of one topology label, and their free capacity summed."""

    members: frozenset[NodeName]
    free: Resources


@dataclass(frozen=True, slots=True)
class Domains:
    """Per tracked topology key, per value: its :class:`Domain`. Immutable."""

    by_key: Mapping[str, Mapping[str, Domain]]

    def of(self, key: str) -> Mapping[str, Domain] | None:
        """The domains of ``key``; ``None`` when ``key`` is not tracked."""
        return self.by_key.get(key)

    def moved(self, changes: Iterable[tuple[NodeState | None, NodeState | None]]) -> Domains:
        """These domains after each ``(old, new)`` node state change (``None``: absent)."""
        by_key = {key: dict(values) for key, values in self.by_key.items()}
        for old, new in changes:
            for key, values in by_key.items():
                _move(values, key, old, new)
        return Domains(by_key)

    @staticmethod
    def of_nodes(keys: Iterable[str], nodes: Iterable[NodeState]) -> Domains:
        """Summed from scratch (for views not kept by a cache)."""
        index = DomainIndex(keys)
        for state in nodes:
            index.update(None, state)
        return index.view()


EMPTY = Domains({})


def _move(
    values: dict[str, Domain], key: str, old: NodeState | None, new: NodeState | None
) -> None:
    old_value = old.node.labels.get(key) if old is not None else None
    new_value = new.node.labels.get(key) if new is not None else None
    if old is not None and old_value is not None:
        domain = values[old_value]
        members = domain.members
        if new is None or new_value != old_value or new.name != old.name:
            members = members - {old.name}
        if members:
            values[old_value] = Domain(members, domain.free - old.free)
        else:
            del values[old_value]
    if new is not None and new_value is not None:
        there = values.get(new_value)
        if there is None:
            values[new_value] = Domain(frozenset((new.name,)), new.free)
        else:
            members = there.members
            if new.name not in members:
                members = members | {new.name}
            values[new_value] = Domain(members, there.free + new.free)


class DomainIndex:
    """The mutable :class:`Domains` a cache keeps: told every node state change, in order."""

    __slots__ = ("_by_key",)

    def __init__(self, keys: Iterable[str]) -> None:
        self._by_key: dict[str, dict[str, Domain]] = {key: {} for key in keys}

    def update(self, old: NodeState | None, new: NodeState | None) -> None:
        """Node state ``old`` (``None``: the node was not counted) is now ``new`` (``None``:
        the node is gone)."""
        for key, values in self._by_key.items():
            _move(values, key, old, new)

    def clear(self) -> None:
        for values in self._by_key.values():
            values.clear()

    def view(self) -> Domains:
        return Domains({key: dict(values) for key, values in self._by_key.items()})
