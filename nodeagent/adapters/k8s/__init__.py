"""The node agent's only door to the Kubernetes API (the one importer of ``kubernetes``).

Raw API objects stop here: pods become :class:`nodeagent.core.events.Pod`, the node's revocation
annotation becomes :class:`nodeagent.core.events.Tracked`. Every write goes through one place that
honours dry-run by asking the API server to validate without persisting (``dryRun=All``), so a
dry run exercises RBAC and admission exactly as a real one would. Calls are synchronous (the
official client is); the agent runs them in worker threads.
"""

from nodeagent.adapters.k8s.cluster import (
    ApiError,
    ApiStatus,
    Cluster,
    ConditionRule,
    decode_revocation,
    encode_revocation,
    matching_condition,
)

__all__ = [
    "ApiError",
    "ApiStatus",
    "Cluster",
    "ConditionRule",
    "decode_revocation",
    "encode_revocation",
    "matching_condition",
]
