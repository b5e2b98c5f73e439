"""Chromium for the web view's browser tests, from Debian's packages.

``find`` says where a usable ``chromium`` is, or why there is none; ``ensure`` installs the
Debian package ``chromium`` when it is missing and this process may (root, with apt-get),
keeping the downloaded packages in the cache beside the control plane's binaries
(``~/.cache/shoal/devcluster/apt``), so that a machine that lost the package installs it again
without downloading. Without root or apt-get there is nothing to install with: the tests that
need the browser are skipped with the reason ``find`` gives.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Final

from devcluster import apt, build
from devcluster.errors import DevclusterError

#: The Debian package and the names its binary has had.
PACKAGE: Final = "chromium"
NAMES: Final = ("chromium", "chromium-browser")
#: Where a browser outside the PATH may be named.
ENV: Final = "SHOAL_CHROMIUM"


class BrowserUnavailable(DevclusterError):
    """No Chromium here, and none can be installed; the message says why."""


def find() -> Path:
    """The Chromium binary to run; :class:`BrowserUnavailable` saying why there is none."""
    named = os.environ.get(ENV)
    if named:
        if os.access(named, os.X_OK):
            return Path(named)
        raise BrowserUnavailable(f"{ENV}={named} is not an executable file")
    for name in NAMES:
        found = shutil.which(name)
        if found:
            return Path(found)
    raise BrowserUnavailable(
        f"no {' or '.join(NAMES)} on PATH: install Debian's package `{PACKAGE}` "
        "(`make browser` as root does) or name one in " + ENV
    )


def ensure(*, say: build.Say = build._say) -> Path:
    """The Chromium binary, installed from Debian's packages first when it is missing."""
    try:
        return find()
    except BrowserUnavailable as missing:
        reason = missing
    why = apt.ensure([PACKAGE], str(reason), what="it", prefix="devcluster", say=say)
    if why:
        raise BrowserUnavailable(why)
    return find()
