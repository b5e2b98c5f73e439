"""The pods bound to this node, kept in a file so that a restarted agent knows its workers while
the API server cannot be reached.

Workers are identified by namespace, name and uid (see :mod:`nodeagent.notify.server`); an agent
that starts while the API server is down cannot list its pods, and without this file it would
refuse every worker exactly when the control plane is in trouble. The file holds only what
identification and the store's decisions need (its content, and how it is read, is
:mod:`nodeagent.core.podcodec`, pure).

It is written whole to a temporary file in the same folder and renamed over the old one, so a
reader finds the old list or the new one, never a mix. A missing, truncated, malformed,
oversized or other node's file reads as no pods, with one log line: the file is only a head
start, and the first pod list the API server answers replaces it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import structlog

from nodeagent.core.events import Pod
from nodeagent.core.podcodec import FILENAME, MAX_BYTES, MAX_PODS, CacheError, decode, encode

__all__ = ["FILENAME", "MAX_BYTES", "MAX_PODS", "CacheError", "PodCache", "decode", "encode"]

log = structlog.get_logger("nodeagent.adapters.podcache")


@dataclass(slots=True)
class PodCache:
    """The file ``path`` for node ``node``: :meth:`load` at start, :meth:`save` after each
    successful pod list (written only when the list changed)."""

    path: Path
    node: str
    _saved: tuple[Pod, ...] | None = field(default=None, init=False)
    _failing: bool = field(default=False, init=False)

    def load(self) -> tuple[Pod, ...]:
        """The pods last saved; empty (and one log line) when there is no usable file."""
        try:
            with self.path.open("rb") as f:
                data = f.read(MAX_BYTES + 1)
        except FileNotFoundError:
            log.info("pod_cache_absent", path=str(self.path))
            return ()
        except OSError as exc:
            log.warning("pod_cache_unreadable", path=str(self.path), error=str(exc))
            return ()
        try:
            pods = decode(data, self.node)
        except CacheError as exc:
            log.warning("pod_cache_unreadable", path=str(self.path), error=str(exc))
            return ()
        self._saved = tuple(sorted(pods, key=lambda p: (p.key, p.uid)))
        log.info("pod_cache_loaded", path=str(self.path), pods=len(pods))
        return pods

    def save(self, pods: Sequence[Pod], now: datetime) -> bool:
        """Replace the file with ``pods`` (atomically). Returns False when it could not be
        written; that is logged once per streak of failures, never raised."""
        ordered = tuple(sorted(pods, key=lambda p: (p.key, p.uid)))
        if ordered == self._saved:
            return True
        if len(ordered) > MAX_PODS:
            log.warning("pod_cache_truncated", pods=len(ordered), kept=MAX_PODS)
        text = encode(self.node, ordered, now)
        try:
            self._write(text.encode())
        except OSError as exc:
            if not self._failing:
                log.warning("pod_cache_unwritable", path=str(self.path), error=str(exc))
            self._failing = True
            return False
        if self._failing:
            log.info("pod_cache_writable", path=str(self.path))
        self._failing = False
        self._saved = ordered
        return True

    def _write(self, data: bytes) -> None:
        folder = self.path.parent
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=folder)  # mode 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        # The rename itself survives a power cut only once the folder is synced (best effort).
        with contextlib.suppress(OSError):
            dir_fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
