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
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import NoReturn


def leave(status: int) -> NoReturn:
    """Exit with ``status`` after the exit handlers, without the interpreter's teardown."""
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # closed: nothing more to say there
                stream.flush()
        os._exit(status)
