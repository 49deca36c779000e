"""Sign-in with Gitea as an OAuth2 client: the authorization code flow with PKCE (RFC
7636, method S256) and ``state`` (RFC 6749 10.12), as pure functions and records.

The flow: the sign-in page makes a :class:`Pending` (state, verifier, where to return),
keeps it in a signed cookie and sends the browser to :func:`authorize_url`; Gitea sends
it back with ``code`` and ``state``; :func:`check_callback` refuses a state that is not
the cookie's (a forged or replayed callback), then the code is exchanged with the
verifier, which only the one who started the flow knows.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from urllib.parse import urlencode

# What forgeflow asks of the user's token: to read repositories (their permissions) and
# the user's own account (site administrator or not). Gitea 1.22+ limits an OAuth2
# token to these when they are named; older Gitea grants its tokens everything.
SCOPE = "read:repository read:user"
CALLBACK_PATH = "/ui/oauth/callback"
VERIFIER_CHARS = 64  # RFC 7636: 43 to 128 characters of [A-Za-z0-9-._~]
STATE_CHARS = 43


class OAuthRefused(Exception):
    """A callback forgeflow does not accept; ``str()`` says why, for the page, and
    ``code`` names it for the audit of refusals (``ui.signin.reject``)."""

    def __init__(self, message: str, code: str = "oauth_refused") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Pending:
    """One started sign-in: what the callback must match and what it needs."""

    state: str
    verifier: str
    next_url: str

    @property
    def challenge(self) -> str:
        return challenge_of(self.verifier)


def challenge_of(verifier: str) -> str:
    """S256: BASE64URL(SHA256(verifier)) without padding."""
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def start(next_url: str) -> Pending:
    # token_urlsafe's alphabet ([A-Za-z0-9_-]) is inside RFC 7636's unreserved set.
    verifier = secrets.token_urlsafe(48)[:VERIFIER_CHARS]
    return Pending(secrets.token_urlsafe(32)[:STATE_CHARS], verifier, next_url)


def redirect_uri(public_url: str) -> str:
    return public_url.rstrip("/") + CALLBACK_PATH


def authorize_url(gitea_url: str, client_id: str, public_url: str, pending: Pending) -> str:
    query = urlencode(
        {
            "client_id": client_id,
            "redirect_uri": redirect_uri(public_url),
            "response_type": "code",
            "scope": SCOPE,
            "state": pending.state,
            "code_challenge": pending.challenge,
            "code_challenge_method": "S256",
        }
    )
    return f"{gitea_url.rstrip('/')}/login/oauth/authorize?{query}"


def check_callback(
    pending: Pending | None, state: str | None, code: str | None, error: str | None
) -> str:
    """The authorization code of a callback that answers ``pending``, else
    :class:`OAuthRefused`. The state is compared in constant time."""
    if pending is None:
        raise OAuthRefused(
            "this sign-in was not started here or took too long; start again",
            "oauth_no_flow",
        )
    given = (state or "").encode("utf-8", "replace")
    if not hmac.compare_digest(given, pending.state.encode("ascii")):
        raise OAuthRefused(
            "the answer from Gitea does not belong to this sign-in (state)", "oauth_bad_state"
        )
    if error:
        raise OAuthRefused(f"Gitea did not grant access ({error[:80]})", "oauth_denied")
    if not code or len(code) > 2048:
        raise OAuthRefused("the answer from Gitea carries no authorization code", "oauth_no_code")
    return code


@dataclass(frozen=True, slots=True)
class Tokens:
    """A token answer of Gitea's token endpoint (kept sealed, never shown)."""

    access_token: str
    refresh_token: str
    expires_at: float  # epoch seconds

    def __repr__(self) -> str:  # never the tokens, in a log line or a traceback
        return f"Tokens(expires_at={self.expires_at})"


@dataclass(frozen=True, slots=True)
class GiteaUser:
    """Who signed in: a Gitea login, and whether the operator made them an operator."""

    login: str
    operator: bool


def is_operator(login: str, site_admin: bool, listed: frozenset[str], admins: bool) -> bool:
    """Operators among Gitea users: the logins the operator listed (case-insensitively,
    as Gitea compares logins), and site administrators when the operator said so."""
    return login.lower() in listed or (admins and site_admin)
