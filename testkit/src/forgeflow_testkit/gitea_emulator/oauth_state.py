"""Gitea as an OAuth2 provider, in memory: applications, grants, authorization codes,
access and refresh tokens, and the web sign-in sessions of the authorize page.

Shapes follow Gitea 1.22: models/auth/oauth2.go (OAuth2Application, OAuth2Grant,
OAuth2AuthorizationCode with its PKCE check) and services/oauth2_provider (the token
answer). Gitea signs its tokens as JWTs; here they are opaque random strings, which is
all a client may assume of them anyway.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta


@dataclass
class OAuthApp:
    id: int
    uid: int
    name: str
    client_id: str
    client_secret: str
    confidential_client: bool
    skip_secondary_authorization: bool
    redirect_uris: list[str]
    created: datetime


@dataclass
class Grant:
    id: int
    app_id: int
    user_id: int
    scope: str
    counter: int = 1


@dataclass
class AuthCode:
    code: str
    grant_id: int
    redirect_uri: str
    challenge: str
    method: str
    expires: datetime
    used: bool = False

    def validate_challenge(self, verifier: str) -> bool:
        """models/auth/oauth2.go ValidateCodeChallenge: S256 is the base64url (no
        padding) of the verifier's SHA-256; "plain" the verifier itself; no challenge
        passes anything (a confidential client without PKCE)."""
        if self.method == "S256":
            digest = hashlib.sha256(verifier.encode()).digest()
            expected = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
            return hmac.compare_digest(expected, self.challenge)
        if self.method == "plain":
            return hmac.compare_digest(verifier, self.challenge)
        return True


@dataclass
class OAuthStore:
    """Everything of the OAuth2 provider; guarded by the State's lock."""

    apps: dict[int, OAuthApp] = field(default_factory=dict)
    grants: dict[int, Grant] = field(default_factory=dict)
    codes: dict[str, AuthCode] = field(default_factory=dict)
    # access token -> (grant id, expiry); the token is also one of State.tokens
    access: dict[str, tuple[int, datetime]] = field(default_factory=dict)
    # refresh token -> (grant id, the grant's counter when it was issued)
    refresh: dict[str, tuple[int, int]] = field(default_factory=dict)
    passwords: dict[int, str] = field(default_factory=dict)
    web_sessions: dict[str, int] = field(default_factory=dict)  # cookie -> user id
    # setting.OAuth2.AccessTokenExpirationTime (seconds; Gitea's default 3600)
    access_seconds: int = 3600
    next_id: int = 1

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def create_app(
        self, uid: int, name: str, uris: list[str], confidential: bool, skip: bool, now: datetime
    ) -> OAuthApp:
        app = OAuthApp(
            self.new_id(), uid, name, str(uuid.uuid4()), new_secret(), confidential, skip, uris, now
        )
        self.apps[app.id] = app
        return app

    def expired(self, token: str, now: datetime) -> bool:
        """An OAuth2 access token past its expiry (a personal token never is)."""
        found = self.access.get(token)
        return found is not None and found[1] <= now

    def app_by_client_id(self, client_id: str) -> OAuthApp | None:
        return next((a for a in self.apps.values() if a.client_id == client_id), None)

    def grant_of(self, app: OAuthApp, user_id: int) -> Grant | None:
        return next(
            (g for g in self.grants.values() if g.app_id == app.id and g.user_id == user_id), None
        )

    def new_code(
        self, grant: Grant, redirect_uri: str, challenge: str, method: str, now: datetime
    ) -> str:
        # Gitea: a random code, valid 10 minutes, for one use.
        code = secrets.token_urlsafe(32)
        expires = now + timedelta(minutes=10)
        self.codes[code] = AuthCode(code, grant.id, redirect_uri, challenge, method, expires)
        return code

    def issue(self, grant: Grant, tokens: dict[str, int], now: datetime) -> dict[str, object]:
        """services/oauth2_provider NewAccessTokenResponse (InvalidateRefreshTokens on:
        the grant's counter moves, so an older refresh token is refused)."""
        grant.counter += 1
        access = secrets.token_urlsafe(40)
        refresh = secrets.token_urlsafe(40)
        self.access[access] = (grant.id, now + timedelta(seconds=self.access_seconds))
        tokens[access] = grant.user_id
        self.refresh[refresh] = (grant.id, grant.counter)
        return {
            "access_token": access,
            "token_type": "bearer",
            "expires_in": self.access_seconds,
            "refresh_token": refresh,
        }


def new_secret() -> str:
    # Gitea GenerateClientSecret: "gto_" and a random base32 string.
    raw = base64.b32encode(secrets.token_bytes(32)).decode().rstrip("=").lower()
    return f"gto_{raw}"
