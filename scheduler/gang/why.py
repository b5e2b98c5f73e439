"""Why a gang is where it is, in words: its phase, the reason it waits and the sentence
``kubectl shoal why`` prints (``shoalctl/views.py``) and the web view shows
(``scheduler/web/state.py``). Pure.

Both callers find the same facts in different places — the plugin in the objects the scheduler
wrote (the members' ``PodScheduled`` condition, its Events, the ``shoal.dev/leave-by`` and
``shoal.dev/reclaimed-for`` annotations), the web view in the loop's own gangs and what its
reporter was told — and hand them here, so the two say the same thing in the same words.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from contracts import names
from scheduler.model import Gang, InvalidGang, PodPhase, PodRequest

#: What the scheduler has not said anything about yet.
NOT_CONSIDERED = "not yet considered by the scheduler"


def one_line(text: str) -> str:
    return " ".join(text.split())


def phase(gang: Gang | InvalidGang, reclaiming: bool) -> str:
    """``Invalid``, ``Admitted``, ``Torn`` (members bound, fewer than the minimum),
    ``WaitingForMembers``, ``Reclaiming`` (pods asked to leave for it) or ``Waiting``."""
    if isinstance(gang, InvalidGang):
        return "Invalid"
    bound = len(gang.bound)
    if bound >= gang.min_member:
        return "Admitted"
    if bound > 0:
        return "Torn"
    if len(gang.members) < gang.min_member:
        return "WaitingForMembers"
    return "Reclaiming" if reclaiming else "Waiting"


def told_reason(gang: Gang, waiting: bool) -> str:
    """The reason of the Event the scheduler writes when it cannot place ``gang``'s pods
    (``waiting``: members are still being created)."""
    if waiting:
        return "WaitingForMembers"
    if gang.min_missing > 0 and any(not p.deleting for p in gang.bound):
        return "WaitingForRoom"
    return "FailedScheduling"


def reason(
    gang: Gang | InvalidGang,
    phase_: str,
    victims: Sequence[PodRequest],
    said: tuple[str, str] | None,
) -> tuple[str, str]:
    """``(code, message)``: why the gang is where it is, in one line. ``said`` is the newest
    ``(reason, message)`` the scheduler gave for it (for a torn gang, only a
    ``GangBelowMinimum`` or ``WaitingForRoom``), if any."""
    if isinstance(gang, InvalidGang):
        return gang.reason, one_line(gang.message)
    if phase_ == "Admitted":
        return "", ""
    if phase_ == "Torn":
        if said is not None:
            return said[0], one_line(said[1])
        return "GangBelowMinimum", (
            f"{len(gang.bound)} of {gang.min_member} bound; waiting for "
            f"{gang.min_missing - len(gang.pending)} more member(s)"
        )
    code, text = (said[0], one_line(said[1])) if said is not None else ("", "")
    if phase_ == "WaitingForMembers":
        code = "WaitingForMembers"
        text = text or f"{len(gang.members)} of {gang.min_member} member(s) exist"
    if victims:
        listed = ", ".join(p.key for p in victims)
        text = f"reclaiming {len(victims)} pod(s) for it: {listed}" + (f"; {text}" if text else "")
        code = "Reclaiming"
    return code, text or NOT_CONSIDERED


def decision(
    gang: Gang | InvalidGang,
    phase_: str,
    *,
    bound: int,
    code: str,
    text: str,
    victims: Sequence[PodRequest],
) -> str:
    """The gang's state, its bounds and what it waits for, as a sentence."""
    if isinstance(gang, InvalidGang):
        return f"Not scheduled: its definition is wrong ({code}): {text}"
    counts = f"{bound} of min {gang.min_member} (max {gang.max_member}) bound"
    if phase_ == "Admitted":
        leaving = [p for p in gang.members if names.LEAVE_BY_ANNOTATION in p.annotations]
        told = "".join(
            f" {p.key} is asked to leave by {p.annotations[names.LEAVE_BY_ANNOTATION]}"
            + _leaves_for(p.annotations.get(names.RECLAIMED_FOR_ANNOTATION), gang)
            for p in leaving
        )
        if bound > gang.max_member:
            counts += f", above its maximum {gang.max_member}: the youngest leave"
        return f"Admitted: {counts}.{told}"
    if phase_ == "Torn":
        head = (
            "Running below its raised minimum"
            if code == "WaitingForRoom"
            else "Below its minimum after being admitted"
        )
        return f"{head}: {counts}. {text}"
    if phase_ == "WaitingForMembers":
        return (
            f"Waiting for members: {len(gang.members)} of {gang.min_member} exist, "
            f"none bound until all {gang.min_member} do."
        )
    if phase_ == "Reclaiming":
        listed = ", ".join(p.key for p in victims)
        return (
            f"Waiting for room being reclaimed for it: {counts}; "
            f"{len(victims)} pod(s) asked to leave: {listed}."
        )
    return f"Waiting for capacity: {counts}. {text}"


def _leaves_for(target: str | None, gang: Gang) -> str:
    """Why a member of ``gang`` asked to leave leaves: room for another gang, or its own
    maximum was lowered."""
    if target is None:
        return "."
    if target == gang.key:
        return f" (its gang's maximum is {gang.max_member})."
    return f" to make room for {target}."


def reclaimed_for(key: str, pods: Iterable[PodRequest]) -> list[PodRequest]:
    """The live pods of ``pods`` the scheduler asked to leave to make room for gang ``key``."""
    return [
        p
        for p in pods
        if p.annotations.get(names.RECLAIMED_FOR_ANNOTATION) == key
        and p.phase not in (PodPhase.SUCCEEDED, PodPhase.FAILED)
    ]
