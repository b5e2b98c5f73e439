"""Free ports for the programs the devcluster, the tests, the demo and the benchmarks start.

A port the kernel hands out for ``bind(0)`` comes from its ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``), the same range it takes the source ports of
outgoing connections from. Between the moment a port is found free and the moment the program
it is meant for binds it, a connection to an API server or etcd may take it, and the program
exits with "address already in use": seen once in a full test run beside another run (the
scheduler's HTTP port). The ports here are picked at random below that range, where no
outgoing connection takes one, and each is checked free by binding it.

A port handed out is also marked in :data:`HANDED_OUT` (one empty file per port) and not handed
out again, by any process on the machine, for :data:`RESERVED_FOR` seconds: the program it is
meant for may take a minute to start and bind it on a loaded machine, and once another test run
picked the same port in that minute (an agent's HTTP port answered by another run's scheduler).
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
import time
from pathlib import Path
from typing import Final

#: The lowest port handed out (below it: well-known and commonly configured ports).
LOWEST: Final = 10_000
_RANGE_FILE: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
_TRIES: Final = 200
#: Where the ports handed out are marked, for every process on the machine.
HANDED_OUT: Path = Path(tempfile.gettempdir()) / "shoal-ports"
#: How long a port handed out is not handed out again.
RESERVED_FOR: Final = 600.0


def _below_ephemeral() -> range | None:
    """The ports from :data:`LOWEST` up to the kernel's ephemeral range; ``None`` when that
    range cannot be read or leaves too few below it."""
    try:
        low = int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return range(LOWEST, low) if low - LOWEST >= 1_000 else None


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct free TCP ports on ``host``, all held open until every one is chosen."""
    candidates = _below_ephemeral()
    rng = random.SystemRandom()
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            held.append(_bind_one(host, candidates, rng))
        return [int(sock.getsockname()[1]) for sock in held]
    finally:
        for sock in held:
            sock.close()


def free_port(host: str = "127.0.0.1") -> int:
    """One free TCP port on ``host`` (:func:`free_ports`)."""
    return free_ports(1, host)[0]


def _bind_one(host: str, candidates: range | None, rng: random.SystemRandom) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if candidates is not None:
            for _ in range(_TRIES):
                port = rng.choice(candidates)
                if not _reserve(port):
                    continue
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                return sock
        sock.bind((host, 0))  # no range below the ephemeral one, or all tries taken
        return sock
    except BaseException:
        sock.close()
        raise


def _reserve(port: int) -> bool:
    """Mark ``port`` handed out; False if it was, by any process, less than
    :data:`RESERVED_FOR` seconds ago. Without a folder to mark in, every port may be taken."""
    marker = HANDED_OUT / str(port)
    try:
        HANDED_OUT.mkdir(mode=0o1777, exist_ok=True)
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        return True
    except FileExistsError:
        try:
            if time.time() - marker.stat().st_mtime < RESERVED_FOR:
                return False
            os.utime(marker)
        except OSError:
            return False
        return True
    except OSError:
        return True
