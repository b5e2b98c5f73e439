"""Group pod requests into gangs.

Membership comes from the gang sources in :mod:`scheduler.gang.sources` (the README lists
them), asked in order: a PodGroup of one of the kinds in :mod:`scheduler.gang.kinds` named by
label or annotation (a pod naming two waits), then the CRD-free label ``shoal.dev/gang``, then
the kinds named by a field a controller sets; a pod with none is a gang of one. Each source
reads its own sizes and topology; what is common to every gang is checked here.

Succeeded and Failed pods are not members: they neither count toward the minimum nor hold room.
Only gangs with at least one pod for ``scheduler_name`` are returned; a gang whose members ask
for different schedulers is invalid.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from scheduler.gang.common import GangRef, invalid_gang
from scheduler.gang.kinds import KINDS, Kinds
from scheduler.gang.sources import GangSource, claim
from scheduler.model import Gang, GangKey, InvalidGang, PodGroup, PodPhase, PodRequest


def gang_of(pod: PodRequest, kinds: Kinds = KINDS) -> tuple[GangKey, str | None]:
    """The key of the pod's gang and, for a PodGroup kind, the PodGroup's reference."""
    ref = claim(pod, kinds)[1]
    return ref.key, ref.group


def build_gangs(
    pods: Iterable[PodRequest],
    pod_groups: Mapping[str, PodGroup],
    scheduler_name: str,
    kinds: Kinds = KINDS,
) -> tuple[list[Gang], list[InvalidGang]]:
    """Gangs with work for ``scheduler_name``, and the ones whose definition is wrong.

    ``pod_groups`` maps group references to the PodGroup objects that exist.
    """
    return GangBuilder(scheduler_name, kinds).build(pods, pod_groups)


class GangBuilder:
    """``build_gangs`` that remembers its results: a gang whose member objects and PodGroup are
    the very same objects as last time is not rebuilt (cycles differ by a few pods).

    Given the members already grouped by gang (``Snapshot.members``, kept up to date by the
    cache as pods change), a cycle costs one identity check per gang instead of a pass over
    every pod.
    """

    def __init__(self, scheduler_name: str, kinds: Kinds = KINDS) -> None:
        self.scheduler_name = scheduler_name
        self.kinds = kinds
        self._memo: dict[GangKey, _Memo] = {}

    def build(
        self,
        pods: Iterable[PodRequest],
        pod_groups: Mapping[str, PodGroup],
        grouped: Mapping[GangKey, Sequence[PodRequest]] | None = None,
    ) -> tuple[list[Gang], list[InvalidGang]]:
        if grouped is None:
            by_key: dict[GangKey, list[PodRequest]] = defaultdict(list)
            for pod in pods:
                by_key[gang_of(pod, self.kinds)[0]].append(pod)
            grouped = by_key

        gangs: list[Gang] = []
        invalid: list[InvalidGang] = []
        memo: dict[GangKey, _Memo] = {}
        known = self._memo
        for key, members in grouped.items():
            if not members:
                continue
            old = known.get(key)
            if (
                old is not None
                and _same(old.members, members)
                # The very same pod objects claim the very same gang (``claim`` is a pure
                # function of the pod): only the PodGroup they name may have changed.
                and (old.group is None if old.ref is None else pod_groups.get(old.ref) is old.group)
            ):
                memo[key] = old
                _file(old.result, gangs, invalid)
                continue
            source, found = claim(members[0], self.kinds)
            ref = found.group
            group_obj = pod_groups.get(ref) if ref is not None else None
            try:
                result = self._one(source, found, members, pod_groups)
            except Exception as exc:  # one gang's bad input fails only it
                result = _unreadable(key, members, ref, exc)
            memo[key] = _Memo(members, ref, group_obj, result)
            _file(result, gangs, invalid)
        self._memo = memo
        return gangs, invalid

    def _one(
        self,
        source: GangSource,
        ref: GangRef,
        members: Sequence[PodRequest],
        pod_groups: Mapping[str, PodGroup],
    ) -> Gang | InvalidGang | None:
        live = [p for p in members if not p.finished]
        if not any(p.scheduler_name == self.scheduler_name for p in live):
            return None
        live.sort(key=lambda p: (p.created, p.name))
        others = sorted({p.scheduler_name for p in live} - {self.scheduler_name})
        if others:
            return invalid_gang(
                ref.key,
                live,
                ref.group,
                f"members ask for different schedulerNames ({self.scheduler_name}, "
                f"{', '.join(others)}); every member of a gang must use {self.scheduler_name}",
            )
        result = source.build(ref.key, tuple(live), pod_groups)
        succeeded = sum(1 for p in members if p.phase == PodPhase.SUCCEEDED)
        if succeeded and isinstance(result, Gang):
            result = replace(result, succeeded=succeeded)
        return result


@dataclass(frozen=True, slots=True)
class _Memo:
    """One gang as last built: from these member objects and the PodGroup object ``ref`` named."""

    members: Sequence[PodRequest]
    ref: str | None
    group: PodGroup | None
    result: Gang | InvalidGang | None


def _same(old: Sequence[PodRequest], new: Sequence[PodRequest]) -> bool:
    return old is new or (
        len(old) == len(new) and all(a is b for a, b in zip(old, new, strict=True))
    )


def _file(result: Gang | InvalidGang | None, gangs: list[Gang], invalid: list[InvalidGang]) -> None:
    if isinstance(result, Gang):
        gangs.append(result)
    elif result is not None:
        invalid.append(result)


def _unreadable(
    key: GangKey, members: Sequence[PodRequest], ref: str | None, exc: Exception
) -> InvalidGang:
    """A gang whose objects made reading them raise: invalid, with the fault in the message,
    so that it waits with an Event while every other gang is scheduled."""
    first = members[0]
    return InvalidGang(
        key=key,
        namespace=first.namespace,
        name=key.split("/", 1)[1],
        message=f"its pods or PodGroup could not be read ({type(exc).__name__}: {exc})"[:500],
        members=tuple(members),
        pod_group=ref,
    )
