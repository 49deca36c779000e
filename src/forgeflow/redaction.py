"""Secret redaction for logs, audit metadata and anything shown to people.

Secrets are registered once at start-up; every string that leaves the process through
a log line or an audit row passes through :func:`redact`.
"""

from __future__ import annotations

import base64
import re
from typing import Any
from urllib.parse import quote

_SECRETS: set[str] = set()
_SENSITIVE_KEYS = re.compile(r"(token|secret|password|authorization|api[_-]?key)$", re.I)
# Whatever follows an Authorization header's scheme, whoever printed it (git's curl
# trace, an HTTP library's error): the credential itself, in any encoding.
_AUTH_HEADER = re.compile(r"(authorization:\s*(?:basic|bearer|token)\s+)[^\s\"']+", re.I)
MASK = "***"
# The user names forgeflow's git sends with the bot token (Basic auth is base64 of
# "user:token"): each one's encoding is masked too.
GIT_USERNAMES = ("forgeflow", "ccweb-bot", "x-access-token", "oauth2")


def derived_forms(secret: str, usernames: tuple[str, ...] = GIT_USERNAMES) -> set[str]:
    """The forms a secret travels in: URL-encoded, hex, and base64 of ``user:secret``
    (with and without padding, also of the secret alone), and of the secret inside any
    longer text (a Docker ``auth``, ``user:secret`` of a user not known here)."""
    raw = secret.encode()
    forms = {quote(secret, safe=""), quote(secret), raw.hex(), raw.hex().upper()}
    for prefix in ("", *(f"{u}:" for u in usernames)):
        encoded = base64.b64encode(f"{prefix}{secret}".encode()).decode()
        forms |= {encoded, encoded.rstrip("=")}
        forms.add(base64.urlsafe_b64encode(f"{prefix}{secret}".encode()).decode().rstrip("="))
    forms |= _embedded_base64(raw)
    return {f for f in forms if f != secret}


def _embedded_base64(raw: bytes) -> set[str]:
    """For each of the three places the secret can start in a 3-byte group, the base64
    characters that depend on its bytes alone (whatever comes before and after); only
    for secrets long enough that they are not ordinary words."""
    forms = set()
    for shift in range(3):
        first, end = -(-shift // 3), (shift + len(raw)) // 3  # whole groups of the secret
        if (end - first) * 4 < 16:
            continue
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            forms.add(encode(b"\0" * shift + raw).decode()[4 * first : 4 * end])
    return forms


def register_secrets(values: list[str], *, usernames: tuple[str, ...] = ()) -> None:
    """Remember secret values and their derived forms; short ones are ignored to avoid
    masking ordinary words."""
    names = GIT_USERNAMES + tuple(usernames)
    for value in values:
        if value and len(value) >= 6:
            _SECRETS.add(value)
            _SECRETS.update(derived_forms(value, names))


def forget_secrets(values: list[str]) -> None:
    """Stop masking values that no longer open anything (a revoked capability), so the
    set stays as small as the secrets that are live."""
    for value in values:
        _SECRETS.discard(value)
        _SECRETS.difference_update(derived_forms(value))


def redact_text(text: str) -> str:
    # Longest first: a secret's base64 must not be half-masked by a shorter form.
    for secret in sorted(_SECRETS, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, MASK)
    return _AUTH_HEADER.sub(lambda m: m.group(1) + MASK, text)


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
