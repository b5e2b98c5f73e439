"""``nodeagent.client.distributed``, the former name of :mod:`shoal_worker.distributed`.

Re-exported unchanged for training scripts written before the worker library became its own
distribution; install ``shoal-worker[torch]`` and import :mod:`shoal_worker.distributed`.
"""

from shoal_worker.distributed import (
    EXIT_LEFT,
    EXIT_REJOIN,
    NO_STOP,
    NoticeFlag,
    Stop,
    StopStep,
    acknowledge,
    checkpoint_dir,
    latest_checkpoint,
    read_leave_by,
    resume,
    save_checkpoint,
)

__all__ = [
    "EXIT_LEFT",
    "EXIT_REJOIN",
    "NO_STOP",
    "NoticeFlag",
    "Stop",
    "StopStep",
    "acknowledge",
    "checkpoint_dir",
    "latest_checkpoint",
    "read_leave_by",
    "resume",
    "save_checkpoint",
]
