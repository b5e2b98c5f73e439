"""The fault-injection suite: crashes, restarts, API server trouble, load.

It reuses the scheduler tests' fixtures (a test's own node pool, pods in a fresh namespace,
``python -m scheduler`` processes) on the session's devcluster, and records its figures with
``tests.figures.record`` so they are printed at the end of the run.
"""

from __future__ import annotations

from tests.integration.scheduler.conftest import (  # noqa: F401  (fixtures, by name)
    pod_group_crd,
    pods,
    pool,
    scheduler_name,
    start_scheduler,
)
