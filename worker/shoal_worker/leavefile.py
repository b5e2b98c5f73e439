"""The fallback when the agent's socket is absent: the pod's own ``shoal.dev/leave-by``.

Mount the annotation with the Downward API and name the file in ``SHOAL_LEAVE_BY_FILE``::

    volumes:
      - name: shoal
        downwardAPI:
          items:
            - path: leave-by
              fieldRef: {fieldPath: "metadata.annotations['shoal.dev/leave-by']"}

The file is empty while the pod is not asked to leave, and holds the time (RFC 3339) once the
agent or the scheduler writes the annotation. It is a fallback, not a channel of its own: the
kubelet refreshes such files on its own sync period, up to about a minute after the annotation
changed, where the socket tells at once. It holds a time only, so it cannot be acknowledged.
"""

from __future__ import annotations

import asyncio
import os
from datetime import datetime
from pathlib import Path

from shoal_worker.contract import parse_time


def read_leave_by(path: str | os.PathLike[str]) -> datetime | None:
    """The time the file holds; None when it is missing, empty, or not a time (the kubelet
    replaces the file whole, so a half-written time is never read)."""
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not text:
        return None
    try:
        return parse_time(text)
    except ValueError:
        return None


async def wait_leave_by(path: str | os.PathLike[str], *, every: float = 1.0) -> datetime:
    """Return once the file holds a time (read every ``every`` seconds)."""
    while True:
        found = read_leave_by(path)
        if found is not None:
            return found
        await asyncio.sleep(every)
