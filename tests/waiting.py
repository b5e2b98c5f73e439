"""Waiting for something to become true, the one way every test does it.

Tests never sleep to let time pass: they poll a probe until it holds, and fail with what they
were waiting for when it does not hold in time.

A probe asks for something durable, which stays true once it is: an Event, a record the test's
workers or processes wrote, a metric, a final state. A state that can come and go between two
polls (an annotation until the pod is evicted, a phase, a count at its lowest) is never polled:
an Event that says it happened is waited on instead, or the state is read after the fact from
every version a watch recorded (``tests/integration/history.py``).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")

#: How long a program the test starts (the scheduler, the agent, a CLI) may take to be ready, or
#: to start and refuse its input: a hang detector, not a bound on speed. Seconds on a quiet
#: machine; over a minute when another test run shares the 2 cores (load average 13-20).
STARTS_WITHIN = 300
#: pytest-timeout for a test that trains a real model (torch ranks in pods or Slurm steps): 3-5
#: minutes on a quiet 2-core machine, past the suite's 600 s beside another test run.
TRAINING_TIMEOUT = 1500


def add_machine_wait(
    config: pytest.Config, items: list[pytest.Item], folder: Path, wait: float
) -> None:
    """For a folder whose shared fixture first waits up to ``wait`` s for something the machine
    holds once (a real node, the Slurm slot) while another run has it: that wait falls within
    the first test's time, so each test of ``folder`` gets its own timeout (the suite's, or the
    one it names) plus ``wait``."""
    suite = float(config.getini("timeout") or 0)
    for item in items:
        if item.path.is_relative_to(folder):
            named = item.get_closest_marker("timeout")
            own = float(named.args[0]) if named is not None and named.args else suite
            item.add_marker(pytest.mark.timeout(own + wait))


def poll(probe: Callable[[], T | None], *, timeout: float, interval: float = 0.25) -> T | None:
    """Call ``probe`` every ``interval`` s until it returns something truthy (returned), or
    ``timeout`` s pass (``None``)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)


def eventually(
    probe: Callable[[], T | None], *, timeout: float = 90, interval: float = 0.25, what: str = ""
) -> T:
    """``poll`` that fails the test, naming ``what``, when ``probe`` never holds."""
    value = poll(probe, timeout=timeout, interval=interval)
    if not value:
        pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
    return value


async def arrives(
    probe: Callable[[], T | Awaitable[T | None] | None],
    *,
    seconds: float = 10,
    interval: float = 0.01,
    what: str = "",
) -> T:
    """``eventually`` inside an event loop: the loop keeps running while it waits, and
    ``probe`` may be a coroutine function."""
    deadline = time.monotonic() + seconds
    while True:
        value = probe()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {seconds:.0f} s waiting for {what}")
        await asyncio.sleep(interval)
