"""Gitea as forgeflow's OAuth2 provider, and what a signed-in user's token may read:
the token endpoint (a code with its PKCE verifier, a refresh), ``/login/oauth/userinfo``,
the user's account (site administrator or not) and the user's permissions on a
repository (``GET /api/v1/repos/{owner}/{repo}``: ``permissions``).

Shapes: Gitea 1.22 routers/web/auth/oauth2_provider.go (AccessTokenResponse,
AccessTokenError, userInfoResponse), structs.Repository.Permissions. Tokens travel only
in headers and form bodies; no error carries one.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import quote

import aiohttp
from pydantic import BaseModel, ValidationError

from forgeflow.domain.oauth import Tokens
from forgeflow.domain.permissions import Permission
from forgeflow.gitea.transport import GiteaError, GiteaUnavailable, Pool, proxy_for

CONNECTIONS = 8


class TokenRefused(GiteaError):
    """Gitea refused a code, a verifier, a refresh token or a client (its ``error``)."""

    code = "oauth_refused"


class TokenInvalid(GiteaError):
    """The user's access token no longer works (401): sign in again."""

    code = "oauth_token_invalid"


class _TokenAnswer(BaseModel):
    access_token: str
    token_type: str
    expires_in: int
    refresh_token: str = ""


class _UserInfo(BaseModel):
    sub: str
    preferred_username: str


class _Account(BaseModel):
    login: str
    is_admin: bool = False


class _Permissions(BaseModel):
    admin: bool = False
    push: bool = False
    pull: bool = False


class _RepoAnswer(BaseModel):
    permissions: _Permissions | None = None


class OAuthClient:
    """The OAuth2 client forgeflow is in Gitea (one per process)."""

    def __init__(
        self, gitea_url: str, client_id: str, client_secret: str, *, timeout: float = 10.0
    ) -> None:
        self._base = gitea_url.rstrip("/")
        self.client_id = client_id
        self._secret = client_secret
        headers = {"Accept": "application/json", "User-Agent": "forgeflow"}
        self._pool = Pool(CONNECTIONS, timeout, headers, proxy_for(gitea_url))

    async def aclose(self) -> None:
        await self._pool.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        token: str | None = None,
        form: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            async with self._pool.session().request(
                method,
                self._base + path,
                data=form,
                headers=headers,
                allow_redirects=False,
                proxy=self._pool.proxy,
            ) as response:
                status, body = response.status, await response.read()
        except aiohttp.ClientError as exc:
            raise GiteaUnavailable(f"{method} {path}: {type(exc).__name__}") from None
        except TimeoutError:
            raise GiteaUnavailable(f"{method} {path}: timed out") from None
        if status >= 500:
            raise GiteaUnavailable(f"{method} {path}: HTTP {status}", status)
        try:
            return status, json.loads(body) if body.strip() else None
        except ValueError:
            return status, None

    async def _tokens(self, form: dict[str, str]) -> Tokens:
        path = "/login/oauth/access_token"
        form = {**form, "client_id": self.client_id, "client_secret": self._secret}
        status, body = await self._call("POST", path, form=form)
        if status != 200:
            error = body.get("error") if isinstance(body, dict) else None
            raise TokenRefused(f"POST {path}: {str(error or f'HTTP {status}')[:80]}", status)
        try:
            answer = _TokenAnswer.model_validate(body)
        except ValidationError:
            raise GiteaError(f"POST {path}: malformed token answer", status) from None
        expires = time.time() + max(answer.expires_in, 0)
        return Tokens(answer.access_token, answer.refresh_token, expires)

    async def exchange(self, code: str, verifier: str, redirect_uri: str) -> Tokens:
        """authorization_code: the callback's code, with the verifier only we know."""
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "code_verifier": verifier,
            "redirect_uri": redirect_uri,
        }
        return await self._tokens(form)

    async def refresh(self, refresh_token: str) -> Tokens:
        return await self._tokens({"grant_type": "refresh_token", "refresh_token": refresh_token})

    async def login_of(self, access_token: str) -> str:
        """The login the token belongs to (``preferred_username`` of userinfo)."""
        status, body = await self._call("GET", "/login/oauth/userinfo", token=access_token)
        if status == 401:
            raise TokenInvalid("GET /login/oauth/userinfo: HTTP 401", status)
        if status != 200:
            raise GiteaError(f"GET /login/oauth/userinfo: HTTP {status}", status)
        try:
            return _UserInfo.model_validate(body).preferred_username
        except ValidationError:
            raise GiteaError("GET /login/oauth/userinfo: malformed answer", status) from None

    async def is_site_admin(self, access_token: str) -> bool:
        status, body = await self._call("GET", "/api/v1/user", token=access_token)
        if status == 401:
            raise TokenInvalid("GET /api/v1/user: HTTP 401", status)
        if status != 200:
            raise GiteaError(f"GET /api/v1/user: HTTP {status}", status)
        try:
            return _Account.model_validate(body).is_admin
        except ValidationError:
            raise GiteaError("GET /api/v1/user: malformed answer", status) from None

    async def access(self, access_token: str, owner: str, repo: str) -> Permission:
        """The user's permission on the repository, as Gitea computes it for them: 404 (a
        private repository they cannot see, or none at all) is no access."""
        path = f"/api/v1/repos/{quote(owner, safe='')}/{quote(repo, safe='')}"
        status, body = await self._call("GET", path, token=access_token)
        if status == 401:
            raise TokenInvalid(f"GET {path}: HTTP 401", status)
        if status in (403, 404):
            return Permission.NONE
        if status != 200:
            raise GiteaError(f"GET {path}: HTTP {status}", status)
        try:
            perms = _RepoAnswer.model_validate(body).permissions
        except ValidationError:
            raise GiteaError(f"GET {path}: malformed Repository answer", status) from None
        if perms is None:
            return Permission.NONE
        if perms.admin:
            return Permission.ADMIN
        if perms.push:
            return Permission.WRITE
        return Permission.READ if perms.pull else Permission.NONE
