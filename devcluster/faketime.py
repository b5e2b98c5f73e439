"""libfaketime for the agent's clock-skew test, from Debian's package ``faketime``.

The skew test runs the agent with its clock moved two ways: through the agent's own test hook
(always) and through libfaketime preloaded into the whole process, as ``faketime -f +90s`` would.
``ensure`` installs the package when the library is missing and this process may (root, with
apt-get), its archives kept in the same cache folder as the browser's; without root or apt-get
it says why, and the libfaketime case of that test is skipped with the same reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from devcluster import apt, build
from devcluster.errors import DevclusterError

PACKAGE: Final = "faketime"
#: Where Debian's package puts the library (the test preloads it from here).
LIBRARY: Final = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


class FaketimeUnavailable(DevclusterError):
    """No libfaketime here, and none can be installed; the message says why."""


def ensure(*, say: build.Say = build._say) -> Path:
    """The library's path, installed from Debian's packages first when it is missing."""
    if LIBRARY.exists():
        return LIBRARY
    reason = f"no libfaketime at {LIBRARY} (Debian package {PACKAGE})"
    why = apt.ensure([PACKAGE], reason, what="it", prefix="devcluster", say=say)
    if why:
        raise FaketimeUnavailable(why)
    if not LIBRARY.exists():
        raise FaketimeUnavailable(f"{reason}; the installed package has no {LIBRARY}")
    return LIBRARY
