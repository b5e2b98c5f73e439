"""The devcluster exception tree: every fault a user can act on carries a readable message."""


class DevclusterError(Exception):
    """Base of every devcluster fault."""


class BuildError(DevclusterError):
    """The Go toolchain is missing or a binary failed to build."""


class StartError(DevclusterError):
    """A component did not start or did not become ready; the message names its log."""


class NotRunningError(DevclusterError):
    """No devcluster is recorded in the run folder."""
