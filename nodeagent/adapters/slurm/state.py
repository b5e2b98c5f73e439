"""The agent's own record on a Slurm node: the live notices it drained the node under, and the
notice each job was told. Slurm keeps neither (a drain reason is one line of text), and a
restarted agent must neither tell a job twice nor leave the node drained when the notice it
drained under was withdrawn while it was down. On Kubernetes the node's and pods' annotations
hold this; here it is a file in ``--state-dir`` (written whole, then renamed over the old one).

A missing or unreadable file is no record (one log line): the agent then starts afresh, as on a
node it never drained.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import structlog

from nodeagent.core.events import EventId, Kind, Notice, Tracked, parse_rfc3339, rfc3339

log = structlog.get_logger("nodeagent.adapters.slurm")

FILENAME: Final = "slurm.json"
MAX_BYTES: Final = 1 << 20


def _notice(raw: dict[str, Any]) -> Notice:
    upstream = raw.get("upstream_id")
    return Notice(
        event_id=EventId(str(raw["event_id"])),
        source=str(raw["source"]),
        channel=str(raw["channel"]),
        kind=Kind(raw["kind"]),
        deadline=parse_rfc3339(str(raw["deadline"])),
        reason=str(raw.get("reason", "")),
        disruptive=bool(raw.get("disruptive", True)),
        upstream_id=None if upstream is None else str(upstream),
    )


def _raw(notice: Notice) -> dict[str, Any]:
    return {
        "event_id": notice.event_id,
        "source": notice.source,
        "channel": notice.channel,
        "kind": notice.kind.value,
        "deadline": rfc3339(notice.deadline),
        "reason": notice.reason,
        "disruptive": notice.disruptive,
        "upstream_id": notice.upstream_id,
    }


@dataclass(slots=True)
class Record:
    """What the file holds: the node's live notices, and per job the notice it was told."""

    notices: list[Tracked] = field(default_factory=list)
    told: dict[str, Notice] = field(default_factory=dict)

    def encode(self) -> bytes:
        doc = {
            "notices": [
                {
                    **_raw(t.notice),
                    "first_seen": rfc3339(t.first_seen),
                    "upstream_acked": t.upstream_acked,
                }
                for t in self.notices
            ],
            "told": {job: _raw(n) for job, n in sorted(self.told.items())},
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Record:
        """Raises ``ValueError`` naming what is wrong."""
        try:
            doc = json.loads(data)
            notices = [
                Tracked(
                    notice=_notice(raw),
                    first_seen=parse_rfc3339(str(raw["first_seen"])),
                    upstream_acked=bool(raw.get("upstream_acked", False)),
                )
                for raw in doc["notices"]
            ]
            told = {str(job): _notice(raw) for job, raw in dict(doc["told"]).items()}
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
            raise ValueError(f"not a record of the agent: {exc!r}") from exc
        return cls(notices=notices, told=told)


@dataclass(slots=True)
class StateFile:
    """The record at ``path`` (None: kept in memory only)."""

    path: Path | None
    record: Record = field(default_factory=Record)

    def load(self) -> Record:
        if self.path is None:
            return self.record
        try:
            with self.path.open("rb") as f:
                data = f.read(MAX_BYTES + 1)
            if len(data) > MAX_BYTES:
                raise ValueError(f"larger than {MAX_BYTES} bytes")
            self.record = Record.decode(data)
        except FileNotFoundError:
            self.record = Record()
        except (OSError, ValueError) as exc:
            log.warning("slurm_state_unreadable", path=str(self.path), error=str(exc))
            self.record = Record()
        return self.record

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{FILENAME}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(self.record.encode())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
