"""Figures the reliability suite measures, printed at the end of the run and saved as JSON.

A test calls ``record("scheduler kills", "kills injected", 50)``; the session prints every
figure under its section after the test summary and writes them to
``$SHOAL_RELIABILITY_OUT`` (default ``build/reliability.json``), which is where
``docs/reliability.md`` takes its numbers from.

Under pytest-xdist each worker records into its own process: it hands its figures back with
``dumped()`` when it finishes, and the controller, which prints and saves them, takes each
worker's in with ``merge()`` (``tests/conftest.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_FIGURES: dict[str, dict[str, object]] = {}


def record(section: str, name: str, value: object) -> None:
    """Keep one figure; the same name recorded twice keeps the last value."""
    _FIGURES.setdefault(section, {})[name] = value


def recorded() -> dict[str, dict[str, object]]:
    return {section: dict(values) for section, values in _FIGURES.items()}


def dumped() -> str:
    """Every figure recorded in this process, as JSON, for ``merge`` in another one."""
    return json.dumps(recorded(), sort_keys=True, default=str)


def merge(text: str) -> None:
    """Take in the figures another process ``dumped``."""
    for section, values in json.loads(text).items():
        for name, value in values.items():
            record(section, name, value)


def output_path() -> Path:
    return Path(os.environ.get("SHOAL_RELIABILITY_OUT", ROOT / "build" / "reliability.json"))


def save() -> Path | None:
    if not _FIGURES:
        return None
    path = output_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(recorded(), indent=2, sort_keys=True, default=str) + "\n")
    return path


def lines() -> list[str]:
    out: list[str] = []
    for section in sorted(_FIGURES):
        out.append(f"{section}:")
        for name, value in _FIGURES[section].items():
            shown = f"{value:.3f}" if isinstance(value, float) else str(value)
            out.append(f"  {name}: {shown}")
    return out
