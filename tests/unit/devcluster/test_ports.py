"""Free ports below the kernel's ephemeral range (devcluster/ports.py)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from devcluster import ports


def test_ports_are_distinct_free_and_below_the_range_outgoing_connections_take() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    chosen = ports.free_ports(50)
    assert len(set(chosen)) == 50
    assert all(ports.LOWEST <= port < low for port in chosen)
    for port in chosen:  # each can be bound by the program it is meant for
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        monkeypatch.setattr(ports, "_below_ephemeral", lambda: range(busy, busy + 2))
        assert all(ports.free_port() != busy for _ in range(20))


def test_a_port_another_process_was_handed_is_not_handed_out_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(ports, "HANDED_OUT", tmp_path)
    monkeypatch.setattr(ports, "_below_ephemeral", lambda: range(port, port + 1))
    (tmp_path / str(port)).touch()  # handed out just now, not bound yet
    assert ports.free_port() != port
    # Once the reservation has run out, it may be handed out again.
    old = time.time() - ports.RESERVED_FOR - 1
    os.utime(tmp_path / str(port), (old, old))
    assert ports.free_port() == port
    assert (tmp_path / str(port)).stat().st_mtime > old


def test_without_the_kernel_range_the_kernel_picks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(ports, "_RANGE_FILE", tmp_path / "absent")
    port = ports.free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
