"""The scheduler's fixtures (its process, a node pool) for the worker's integration tests, and
the scheduler with its admission webhook wiring the test's pods."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.integration.conftest import Devcluster
from tests.integration.scheduler.conftest import (  # noqa: F401
    SchedulerProcess,
    pool,
    scheduler_name,
    start_scheduler,
)
from tests.integration.scheduler.test_webhook import Webhook, serving

#: Long enough that only an acknowledgement gets a reclaimed member out while a test looks.
RECLAIM_GRACE = "600"


@pytest.fixture
def webhook(
    devcluster: Devcluster,
    namespace: str,
    scheduler_name: str,  # noqa: F811
    start_scheduler: Callable[..., SchedulerProcess],  # noqa: F811
) -> Iterator[Webhook]:
    def start(*extra: str, **options: Any) -> SchedulerProcess:
        return start_scheduler(*extra, "--reclaim-grace", RECLAIM_GRACE, **options)

    with serving(Webhook(devcluster, namespace, scheduler_name, start)) as hook:
        yield hook
