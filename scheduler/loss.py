"""What a member would lose if it left now, and how long a reclaim may wait for less. Pure.

A bound member's *expected loss* is the GPU-seconds of work since its last complete checkpoint
plus the cost of restarting it, both read from the ``shoal.dev/progress`` annotation its node
agent writes (:mod:`contracts.progress`)::

    loss = gpus * (progress.seconds_at_risk(now) + restart_seconds)

(a pod that asks for no GPU counts as one). A member without a valid report has an *unknown*
loss: it ranks after every member whose loss is known, never as one that loses nothing
(:meth:`Loss.rank`). Reclaim (:mod:`scheduler.reclaim`) takes victims in that order within
each priority; the simulator passes its own :data:`VictimCost` through
:class:`scheduler.cycle.Config` to model checkpoints.

*Patience*: a waiting gang whose pods or PodGroup carry ``shoal.dev/reclaim-patience``
(seconds), or whose PriorityClass the scheduler's ``--reclaim-patience`` names, lets its
reclaim wait for each victim's next checkpoint, at most that long (:func:`patience`); the
reclaim ledger keeps the wait (:mod:`scheduler.reclaim_ledger`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from contracts import names
from contracts.progress import MAX_SECONDS, Progress, decode_or_none
from scheduler.model import Gang, PodGroup, PodRequest

#: On a gang's pods or its PodGroup: seconds its reclaim may wait for its victims' next
#: checkpoint before asking them to leave anyway.
PATIENCE_ANNOTATION: Final = "shoal.dev/reclaim-patience"


@dataclass(frozen=True, slots=True)
class Loss:
    """A member's expected loss at one moment; ``gpu_seconds`` is ``None`` when unknown."""

    gpu_seconds: float | None
    progress: Progress | None = None
    gpus: int = 1
    at_risk: float = 0.0
    restart: float = 0.0

    @property
    def known(self) -> bool:
        return self.gpu_seconds is not None

    def rank(self) -> tuple[int, float]:
        """The order victims are taken in: known losses, smallest first, then unknown ones."""
        return (0, self.gpu_seconds) if self.gpu_seconds is not None else (1, 0.0)

    def text(self) -> str:
        """The loss in words, for Events."""
        progress = self.progress
        if self.gpu_seconds is None:
            return (
                f"unknown loss (no valid {names.PROGRESS_ANNOTATION} report; ranked after "
                "members whose loss is known)"
            )
        if progress is None:  # a whole gang: its members' losses added up
            return f"{self.gpu_seconds:.0f} GPU-seconds in all, on {self.gpus} GPU(s)"
        return (
            f"{self.gpu_seconds:.0f} GPU-seconds ({self.at_risk:.0f} s since its checkpoint at "
            f"step {progress.checkpoint_step}, plus {self.restart:g} s to restart, on "
            f"{self.gpus} GPU(s))"
        )


class VictimCost(Protocol):
    """The seam reclaim ranks victims by: ``pod``'s expected loss at ``now``."""

    def __call__(self, pod: PodRequest, now: float) -> Loss: ...


@dataclass(frozen=True, slots=True)
class ProgressCost:
    """The live cost: the pod's ``shoal.dev/progress`` report, plus a fixed restart cost."""

    restart_seconds: float = 60.0

    def __call__(self, pod: PodRequest, now: float) -> Loss:
        progress = progress_of(pod)
        gpus = max(1, pod.requests.gpu)
        if progress is None:
            return Loss(None, gpus=gpus, restart=self.restart_seconds)
        at_risk = progress.seconds_at_risk(now)
        total = gpus * (at_risk + self.restart_seconds)
        return Loss(total, progress, gpus, at_risk, self.restart_seconds)


def progress_of(pod: PodRequest) -> Progress | None:
    """The pod's valid progress report, or ``None``."""
    text = pod.annotations.get(names.PROGRESS_ANNOTATION)
    return _decoded(text) if text else None


@functools.lru_cache(maxsize=8192)
def _decoded(text: str) -> Progress | None:
    """:func:`decode_or_none`, remembered by the annotation's text: a report is read once,
    not once per pod per plan per cycle (the same text always reads the same)."""
    return decode_or_none(text)


def checkpoint_mark(progress: Progress | None) -> tuple[int, float] | None:
    """What identifies a pod's last complete checkpoint (a later one differs)."""
    if progress is None:
        return None
    return (progress.checkpoint_step, progress.checkpoint_at or 0.0)


def parse_patience(text: object) -> float:
    """Seconds in a patience annotation; 0 (no patience) when absent or not 0 to a day."""
    if not isinstance(text, str):
        return 0.0
    try:
        value = float(text.strip())
    except ValueError:
        return 0.0
    return value if math.isfinite(value) and 0.0 <= value <= MAX_SECONDS else 0.0


def patience(
    gang: Gang, pod_groups: Mapping[str, PodGroup], by_class: Mapping[str, float] | None = None
) -> float:
    """How long ``gang``'s reclaim may wait for its victims' checkpoints: its PodGroup's
    annotation, else the largest on its members, else what ``by_class`` gives its PriorityClass
    (its PodGroup's, else its members' largest); 0 when none says."""
    group = pod_groups.get(gang.pod_group) if gang.pod_group else None
    if group is not None and PATIENCE_ANNOTATION in group.annotations:
        return parse_patience(group.annotations[PATIENCE_ANNOTATION])
    notes = [
        p.annotations[PATIENCE_ANNOTATION]
        for p in gang.members
        if PATIENCE_ANNOTATION in p.annotations
    ]
    if notes:
        return max(parse_patience(text) for text in notes)
    by_class = by_class or {}
    if group is not None and group.priority_class:
        return by_class.get(group.priority_class, 0.0)
    return max((by_class.get(p.priority_class, 0.0) for p in gang.members), default=0.0)
