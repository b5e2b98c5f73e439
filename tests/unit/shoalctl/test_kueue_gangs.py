"""``kubectl shoal`` shows a Kueue pod group as the scheduler sees it: one gang named after the
group, its source ``kueue``; a pod that also names a ``shoal.dev/gang`` waits as a conflict."""

from __future__ import annotations

from typing import Any

from contracts import names
from shoalctl import views

NOW = 1_800_000_000.0
SCHED = "shoal-scheduler"


def pod(name: str, node: str | None = None, **labels: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": SCHED,
        "containers": [{"name": "w", "resources": {"requests": {names.GPU_RESOURCE: "8"}}}],
    }
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {
            "namespace": "ml",
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": "2027-01-15T07:59:00Z",
            "labels": {"kueue.x-k8s.io/pod-group-name": "eval", **labels},
            "annotations": {"kueue.x-k8s.io/pod-group-total-count": "2"},
        },
        "spec": spec,
        "status": {"phase": "Running" if node else "Pending"},
    }


def test_a_kueue_pod_group_is_one_gang_whose_source_is_kueue() -> None:
    cluster = views.Cluster(
        pods=[pod("eval-0", "n1"), pod("eval-1", "n2"), pod("odd", **{names.GANG_LABEL: "x"})],
        nodes=[],
        events=[],
        groups=[],
    )
    rows = {r["key"]: r for r in views.gangs(cluster, SCHED, NOW)}
    gang = rows["ml/kueue:eval"]
    assert (gang["name"], gang["source"], gang["min"], gang["bound"], gang["max"]) == (
        "eval",
        "kueue",
        2,
        2,
        2,
    )
    assert (rows["ml/conflict:odd"]["name"], rows["ml/conflict:odd"]["source"]) == (
        "odd",
        "conflict",
    )
