"""A Gitea user's tokens at rest: sealed (Fernet: AES-128-CBC with HMAC-SHA256) with a
key derived from the admin token, so the database alone does not hand them out, and
changing the admin token (which signs everyone out) makes them unreadable too."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

from cryptography.fernet import Fernet, InvalidToken

from forgeflow.domain.oauth import Tokens


def _fernet(admin_token: str) -> Fernet:
    key = hmac.new(admin_token.encode(), b"forgeflow.web.gitea-tokens.v1", hashlib.sha256)
    return Fernet(base64.urlsafe_b64encode(key.digest()))


def seal(admin_token: str, tokens: Tokens) -> str:
    body = {"a": tokens.access_token, "r": tokens.refresh_token, "e": tokens.expires_at}
    return _fernet(admin_token).encrypt(json.dumps(body).encode()).decode("ascii")


def unseal(admin_token: str, sealed: str) -> Tokens | None:
    """The tokens, or None when they cannot be read (another admin token, damage)."""
    try:
        body = json.loads(_fernet(admin_token).decrypt(sealed.encode("ascii")))
        return Tokens(str(body["a"]), str(body["r"]), float(body["e"]))
    except (InvalidToken, ValueError, KeyError, TypeError):
        return None
