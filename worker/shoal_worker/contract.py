"""What a worker reads besides the socket: its environment and the values in it.

The webhook (``scheduler/webhook``) and the agent write these under the names in
``contracts/names.py``, with the time codec of ``contracts/times.py``; this distribution is
installed into training images without either program, so it reads them here.
``tests/unit/worker/test_contract.py`` keeps both sides equal: the same names, and the same
times and seconds accepted and refused.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Final

#: The pod's identity (Downward API), the agent's socket, the files.
POD_NAMESPACE_ENV: Final = "POD_NAMESPACE"
POD_NAME_ENV: Final = "POD_NAME"
POD_UID_ENV: Final = "POD_UID"
SOCKET_ENV: Final = "SHOAL_SOCKET"
#: A Slurm job step's identity (set by Slurm in every step's environment; docs/slurm.md). The
#: batch script's own step has no step id in some Slurm versions: it is the "batch" step.
SLURM_JOB_ID_ENV: Final = "SLURM_JOB_ID"
SLURM_STEP_ID_ENVS: Final = ("SLURM_STEP_ID", "SLURM_STEPID")
SLURM_NODE_ENV: Final = "SLURMD_NODENAME"
SLURM_BATCH_STEP: Final = "batch"
#: Where the agent's DaemonSet shares its socket with pods (a hostPath).
DEFAULT_SOCKET: Final = "/run/shoal/agent.sock"
#: The Downward API file of the pod's ``shoal.dev/leave-by``.
LEAVE_BY_FILE_ENV: Final = "SHOAL_LEAVE_BY_FILE"
#: ``shoal.dev/checkpoint-seconds`` as the webhook passes it.
CHECKPOINT_SECONDS_ENV: Final = "SHOAL_CHECKPOINT_SECONDS"
#: The longest checkpoint time ``shoal.dev/checkpoint-seconds`` may declare.
MAX_CHECKPOINT_SECONDS: Final = 86400.0

_EARLIEST: Final = datetime(1970, 1, 1, tzinfo=UTC)
_LATEST: Final = datetime(9000, 1, 1, tzinfo=UTC)
_SECONDS: Final = re.compile(r"^(\d+(\.\d*)?|\.\d+)$")


def parse_time(text: str) -> datetime:
    """An RFC 3339 time with a zone, in UTC, between 1970 and 9000 (what the programs write
    under ``shoal.dev/leave-by``); ``ValueError`` for anything else."""
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"time without a zone: {text!r}")
    try:
        moment = parsed.astimezone(UTC)
    except OverflowError as exc:
        raise ValueError(f"time out of range: {text!r}") from exc
    if not _EARLIEST <= moment < _LATEST:
        raise ValueError(f"time out of range ({_EARLIEST.year} to {_LATEST.year}): {text!r}")
    return moment


def parse_checkpoint_seconds(text: str) -> float:
    """The seconds ``shoal.dev/checkpoint-seconds`` declares: a plain decimal number above 0 and
    at most :data:`MAX_CHECKPOINT_SECONDS`; ``ValueError`` for anything else."""
    value = text.strip()
    if not _SECONDS.fullmatch(value):
        raise ValueError(f"{text!r} is not a number of seconds")
    seconds = float(value)
    if not 0 < seconds <= MAX_CHECKPOINT_SECONDS:
        raise ValueError(f"{text!r} is not between 0 and {MAX_CHECKPOINT_SECONDS:g} seconds")
    return seconds
