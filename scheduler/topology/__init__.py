"""GPU and cluster topology math: free GPUs per NVLink island, and topology domains of nodes.

Pure. In-node accounting: the ``shoal.dev/gpu-topology`` annotation says which GPUs are healthy
and which are already allocated to which pod. Bound or assumed pods that the annotation does not
list yet (the node agent has not seen them) are charged to islands the way the scheduler would
place them: the tightest island that holds the whole pod, else the largest islands first. The
result is a conservative count of free GPUs per island.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from contracts.gputopology import GpuTopology


def free_islands(topology: GpuTopology, pods: Iterable[tuple[str, int]]) -> tuple[int, ...]:
    """Free GPUs per island (island id order) after the GPUs of ``pods`` (key, gpu count).

    Pods the annotation already lists as allocated are not charged a second time.
    """
    free = topology.free()
    islands = topology.islands()
    counts = [len(islands[island] & free) for island in sorted(islands)]
    listed = set(topology.allocated.values())
    result = tuple(counts)
    for key, gpus in pods:
        if gpus > 0 and key not in listed:
            result = take(result, gpus)
    return result


def best_island(islands: Sequence[int], gpus: int) -> int | None:
    """Index of the island with the fewest free GPUs that still holds ``gpus`` of them."""
    best: int | None = None
    for i, free in enumerate(islands):
        if free >= gpus and (best is None or free < islands[best]):
            best = i
    return best


def take(islands: Sequence[int], gpus: int) -> tuple[int, ...]:
    """Islands after placing a pod of ``gpus`` GPUs: one island when one fits, else spread.

    Never goes below zero; a pod larger than the free total empties every island.
    """
    result = list(islands)
    if gpus <= 0:
        return tuple(result)
    fit = best_island(result, gpus)
    if fit is not None:
        result[fit] -= gpus
        return tuple(result)
    left = gpus
    for i in sorted(range(len(result)), key=lambda i: -result[i]):
        used = min(left, result[i])
        result[i] -= used
        left -= used
        if left == 0:
            break
    return tuple(result)


def domain(labels: Mapping[str, str], key: str) -> str | None:
    return labels.get(key)
