"""Early warnings: a node expected to go soon, and the surplus members to move off it. Pure.

A node is *warned* (:func:`warning`) when, before any termination notice:

- it is cordoned (``spec.unschedulable``: a drain, an operator, an autoscaler);
- it carries the taint ``karpenter.sh/disrupted`` (or ``karpenter.sh/disruption``): Karpenter
  chose it for consolidation or expiry;
- its node agent's ``shoal.dev/revocation`` annotation lists only notices that are not
  disruptive (an AWS rebalance recommendation, a scheduled or live-migration maintenance;
  ``Node.early_warning`` carries their reason, :func:`revocation_warning`). A disruptive notice
  on the node is the agent's to act on: it tells every pod itself, so the node is not warned.

Members of a warned node that are *surplus* (their gang keeps its minimum without them; the
least expected loss first, :mod:`scheduler.loss`) are asked to leave for their own gang through
the reclaim ledger, like any reclaim (``shoal.dev/leave-by``, an Event, no eviction before it):
at their next checkpoint when they report progress (at most ``Config.early_warning_wait``
later), at once when they report none. A pod the agent already told (a ``shoal.dev/leave-by``
without ``shoal.dev/reclaimed-for``) is left to it. Only as many move as their replacements
fit elsewhere now (:func:`scheduler.step.step` checks); the replacements are placed as any
pending member: the warned node's own taint or cordon keeps them away from it.
"""

from __future__ import annotations

import json
from typing import Final

from contracts import names
from scheduler.model import Node, PodRequest

#: Taints that say a node is about to be disrupted (Karpenter's, old and new names).
DISRUPTION_TAINTS: Final = ("karpenter.sh/disrupted", "karpenter.sh/disruption")


def warning(node: Node | None) -> str:
    """Why ``node`` is expected to go soon; "" when it is not warned."""
    if node is None:
        return ""
    if node.early_warning:
        return node.early_warning
    taint = next((t for t in node.taints if t.key in DISRUPTION_TAINTS), None)
    if taint is not None:
        return f"taint {taint.key}"
    if node.unschedulable:
        return "cordoned"
    return ""


def revocation_warning(text: object) -> str:
    """The early warning in a node's ``shoal.dev/revocation`` annotation: the reason of its
    notices when none is disruptive, "" otherwise (none, a disruptive one, or unreadable)."""
    if not isinstance(text, str) or not text:
        return ""
    try:
        document = json.loads(text)
    except (ValueError, RecursionError):
        return ""
    notices = document.get("notices") if isinstance(document, dict) else None
    if not isinstance(notices, list) or not notices:
        return ""
    if not all(isinstance(n, dict) and n.get("disruptive") is False for n in notices):
        return ""
    first = notices[0]
    return f"{first.get('kind', 'notice')}: {first.get('reason', '')}".strip(": ")


def told_by_agent(pod: PodRequest) -> bool:
    """The node agent already told ``pod`` to leave (a notice of its own)."""
    notes = pod.annotations
    return names.LEAVE_BY_ANNOTATION in notes and names.RECLAIMED_FOR_ANNOTATION not in notes
