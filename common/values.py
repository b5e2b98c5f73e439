"""Values of flags, environment variables and config files that both programs read alike."""

from __future__ import annotations

TRUE = ("1", "true", "yes", "on")
FALSE = ("", "0", "false", "no", "off")


def parse_bool(text: str) -> bool:
    """``true``/``false`` and their usual spellings; ``ValueError`` naming the value otherwise."""
    lowered = text.strip().lower()
    if lowered in TRUE:
        return True
    if lowered in FALSE:
        return False
    raise ValueError(f"expected true or false, got {text!r}")
