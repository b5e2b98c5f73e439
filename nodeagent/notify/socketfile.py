"""The notice socket as a file on the node: which inode the agent serves, what a check of the
path finds, and its folder as it was at start-up.

A node's clean-up, a tmpfs remount or a hostPath recreated can remove the socket file or its
folder while the agent runs. The agent's listening socket then lives on, unreachable by path:
workers already connected keep hearing notices, but a new one finds nothing to connect to.
:class:`nodeagent.notify.server.NoticeServer` checks the path every second with :func:`change`
and serves it again; this module holds the file-level steps it takes, each small enough to test
with plain files.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class FileId:
    """One file, whichever name it has: a socket bound again is another inode."""

    device: int
    inode: int

    @classmethod
    def at(cls, path: Path) -> FileId | None:
        """The file at ``path`` now (the link itself, never what it points to); None when
        nothing is there."""
        try:
            found = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return cls(found.st_dev, found.st_ino)


class Change(enum.Enum):
    """What a check of the socket path found, when it is not the socket the agent serves."""

    #: Nothing at the path (the file, or its folder, was removed).
    REMOVED = "removed"
    #: Another file at the path (a socket bound by someone else, or any other file).
    REPLACED = "replaced"


def change(served: FileId | None, seen: FileId | None) -> Change | None:
    """What became of the socket the agent serves (``served``; None while it serves none) now
    that the path holds ``seen``: None when it is still there."""
    if seen is None:
        return Change.REMOVED
    if seen != served:
        return Change.REPLACED
    return None


@dataclass(frozen=True, slots=True)
class Folder:
    """The socket's folder as the agent found (or made) it at start-up, so that it can be made
    again alike: on a node, an init container gives it the workers' group and mode 2770."""

    path: Path
    mode: int
    uid: int
    gid: int

    @classmethod
    def made(cls, path: Path) -> Folder:
        """Make ``path`` if missing (as the agent always did at start-up) and remember it."""
        path.mkdir(parents=True, exist_ok=True)
        found = os.stat(path)
        return cls(path, stat.S_IMODE(found.st_mode), found.st_uid, found.st_gid)

    def restore(self) -> bool:
        """Make the folder again with its start-up mode and, as far as the agent may, owner and
        group; True when it had to. Raises :class:`OSError` when it cannot be made (a file in
        its place, a read-only file system, no permission)."""
        if self.path.is_dir():
            return False
        self.path.mkdir(parents=True)
        os.chmod(self.path, self.mode)
        found = os.stat(self.path)
        if (found.st_uid, found.st_gid) != (self.uid, self.gid):
            # Only root may give the folder another owner; its group, the one workers reach it
            # through, the agent may set when it is one of the agent's groups.
            for uid in (self.uid, -1):
                with contextlib.suppress(PermissionError):
                    os.chown(self.path, uid, self.gid)
                    break
        return True

    def removed_under_mount(self) -> bool:
        """The folder is still there by name but deleted (its link count is 0): a hostPath
        folder removed on the host stays mounted, deleted, in the agent's container, and
        nothing can be created in it until the container starts again."""
        try:
            return os.stat(self.path).st_nlink == 0
        except OSError:
            return False


def clear(path: Path) -> None:
    """Remove whatever file is at ``path`` (a stale socket); a folder there is left (raises)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def can_bind(path: Path) -> None:
    """Bind and remove a socket at ``path``, so that a failure raises :class:`OSError` with
    its cause (gRPC only says that it failed)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.bind(str(path))
    finally:
        probe.close()
    clear(path)


def listening(path: Path) -> bool:
    """Whether a process accepts connections on the socket at ``path`` (another agent serving
    it, which the agent must not take it from)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    try:
        probe.connect(str(path))
    except OSError as exc:
        # EAGAIN: its backlog is full, so it listens but is busy; anything else (refused, not
        # a socket) is no listener.
        return exc.errno == errno.EAGAIN
    finally:
        probe.close()
    return True
