"""Cloud revocation monitors: one module per cloud behind the
:class:`~nodeagent.core.ports.Provider` protocol.

A provider reads its cloud's metadata server and reports *complete* observations of each of its
channels (``aws/spot``, ``gcp/preempted``, ...) to a :class:`~nodeagent.core.ports.Sink`
(failing with a :class:`~nodeagent.core.ports.ProviderError`); failures are reported too and
never end the watch. Deduplication and withdrawal are the store's job, not the provider's: a
provider only has to derive a stable event id from what the cloud says.
"""

from nodeagent.adapters.providers.base import (
    BadBody,
    BadStatus,
    HttpSettings,
    TooLarge,
    Unreachable,
)

__all__ = [
    "BadBody",
    "BadStatus",
    "HttpSettings",
    "TooLarge",
    "Unreachable",
]
