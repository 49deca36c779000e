"""Secret redaction for logs, audit metadata and anything shown to people.

Secrets are registered once at start-up; every string that leaves the process through
a log line or an audit row passes through :func:`redact`.
"""

from __future__ import annotations

import re
from typing import Any

_SECRETS: set[str] = set()
_SENSITIVE_KEYS = re.compile(r"(token|secret|password|authorization|api[_-]?key)$", re.I)
MASK = "***"


def register_secrets(values: list[str]) -> None:
    """Remember secret values; short ones are ignored to avoid masking ordinary words."""
    _SECRETS.update(v for v in values if v and len(v) >= 6)


def forget_secrets(values: list[str]) -> None:
    """Stop masking values that no longer open anything (a revoked capability), so the
    set stays as small as the secrets that are live."""
    _SECRETS.difference_update(values)


def redact_text(text: str) -> str:
    for secret in _SECRETS:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def redact(value: Any) -> Any:
    """Recursively mask registered secret values and values under sensitive keys."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {
            k: (MASK if isinstance(k, str) and _SENSITIVE_KEYS.search(k) and v else redact(v))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    return value
