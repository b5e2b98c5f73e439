"""A pod that more than one gang source claims (a ``scheduling.x-k8s.io/pod-group`` label and a
Volcano ``scheduling.k8s.io/group-name`` annotation, say, or Kueue's
``kueue.x-k8s.io/pod-group-name`` and Shoal's ``shoal.dev/gang``): which gang it belongs to is
not guessed. It is a gang of its own that is never valid, so it waits with an Event and a
``PodScheduled=False`` condition naming the claims, and never runs as a gang of one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler.gang.common import GangRef, invalid_gang
from scheduler.model import Gang, GangKey, InvalidGang, PodGroup, PodRequest


@dataclass(frozen=True, slots=True)
class ConflictSource:
    """Built by :func:`scheduler.gang.sources.claim` for one pod; ``claims`` describes each
    source's claim in words."""

    claims_text: tuple[str, ...]

    def claims(self, pod: PodRequest) -> GangRef | None:
        return conflict_ref(pod)

    def build(
        self, key: GangKey, pods: Sequence[PodRequest], groups: Mapping[str, PodGroup]
    ) -> Gang | InvalidGang:
        return invalid_gang(
            key,
            pods,
            None,
            f"pod {pods[0].name} names more than one gang ({'; '.join(self.claims_text)}); "
            "it waits until it names one",
        )


def conflict_ref(pod: PodRequest) -> GangRef:
    return GangRef(GangKey(f"{pod.namespace}/conflict:{pod.name}"))
