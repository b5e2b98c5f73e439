"""How both programs leave once their own orderly stop is done.

``python -m scheduler`` and ``python -m nodeagent`` stop their parts in order on SIGTERM (the
scheduling loop and its bindings, the agent's notices and drains), then exit through
:func:`leave`: it runs what was registered to run at exit (the kubeconfig loader's removal of
its temporary credential files, logging's flush), flushes the standard streams, and ends the
process with ``os._exit``, skipping the interpreter's teardown. That teardown is not needed
after an orderly stop, and it is where a daemon thread still inside a native library (a read
of a closed TLS connection, gRPC's own threads) can crash the process: the scheduler as PID 1
in its container once exited 139 (SIGSEGV) instead of 0 on SIGTERM, after its stop had
completed. The images also set ``PYTHONFAULTHANDLER=1``, so a crash anywhere prints every
thread's stack to the container log.

Both also hear a stop from their very first line (:func:`hear_stop`, before any other import).
As PID 1 in a container, a process ignores every signal it has no handler for: a SIGTERM that
came while the program was still starting (imports, a first list, a metadata probe: seconds on
a loaded node) was lost, the program ran on, and the kubelet killed it at the end of its grace
period (exit 137; seen when a pod was deleted right after its container restarted). Heard
early, the stop is remembered, and :func:`stop_on_signal` carries it out as soon as the program
is up.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:  # imported only for the types: hear_stop comes before any slow import
    import asyncio
    from collections.abc import Callable
    from types import FrameType

#: The signals that stop both programs.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_heard = threading.Event()


def _remember(signum: int, frame: FrameType | None) -> None:
    _heard.set()


def hear_stop() -> None:
    """From now on, SIGTERM and SIGINT are remembered instead of ignored (PID 1) or killing the
    process half started; call it first thing, before the program's imports."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _remember)


def stop_asked() -> bool:
    """Whether a stop signal came since :func:`hear_stop`."""
    return _heard.is_set()


def stop_on_signal(loop: asyncio.AbstractEventLoop, stop: Callable[[], None]) -> None:
    """``stop`` on SIGTERM or SIGINT from now on, and at once if one came while starting."""
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop)
    if _heard.is_set():
        stop()


def leave(status: int) -> NoReturn:
    """Exit with ``status`` after the exit handlers, without the interpreter's teardown."""
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # closed: nothing more to say there
                stream.flush()
        os._exit(status)
