"""A small async client for the Gitea REST API (/api/v1) as the bot.

The token travels only in the ``Authorization`` header; errors never include it.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import httpx

from forgeflow.config import Permission


class GiteaError(Exception):
    """Gitea answered with an error or could not be reached."""

    code = "gitea_error"

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class GiteaUnavailable(GiteaError):
    code = "gitea_unavailable"


class GiteaPermissionDenied(GiteaError):
    code = "permission_check_forbidden"


# Gitea's GetRepoPermissions answers "owner" for the owner; we rank it like admin.
_PERMISSIONS = {
    "none": Permission.NONE,
    "read": Permission.READ,
    "write": Permission.WRITE,
    "admin": Permission.ADMIN,
    "owner": Permission.ADMIN,
}


class GiteaClient:
    def __init__(self, base_url: str, token: str | None, *, timeout: float = 10.0) -> None:
        headers = {"Accept": "application/json", "User-Agent": "forgeflow"}
        if token:
            headers["Authorization"] = f"token {token}"
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/") + "/api/v1", headers=headers, timeout=timeout
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise GiteaUnavailable(f"{method} {path}: {type(exc).__name__}") from None
        if response.status_code >= 500:
            raise GiteaUnavailable(
                f"{method} {path}: HTTP {response.status_code}", response.status_code
            )
        return response

    async def repo_permission(self, owner: str, repo: str, login: str) -> Permission:
        """The user's access to the repository, per Gitea's collaborator-permission API."""
        path = (
            f"/repos/{quote(owner, safe='')}/{quote(repo, safe='')}"
            f"/collaborators/{quote(login, safe='')}/permission"
        )
        response = await self._request("GET", path)
        if response.status_code == 404:
            # Gitea answers 404 for a login that does not exist.
            return Permission.NONE
        if response.status_code == 403:
            # Gitea lets only site admins and repository admins read others' permissions.
            raise GiteaPermissionDenied(
                f"the bot may not read collaborator permissions of {owner}/{repo}; "
                "give it admin access to the repository"
            )
        if response.status_code != 200:
            raise GiteaError(f"GET {path}: HTTP {response.status_code}", response.status_code)
        value = str(response.json().get("permission", "none")).lower()
        return _PERMISSIONS.get(value, Permission.NONE)


class PermissionCache:
    """Caches permission answers briefly: a burst of comments costs one lookup."""

    def __init__(self, client: GiteaClient, ttl_seconds: float) -> None:
        self._client = client
        self._ttl = ttl_seconds
        self._entries: dict[tuple[str, str, str], tuple[float, Permission]] = {}

    async def permission(self, owner: str, repo: str, login: str) -> Permission:
        key = (owner.lower(), repo.lower(), login.lower())
        now = time.monotonic()
        hit = self._entries.get(key)
        if hit is not None and now - hit[0] < self._ttl:
            return hit[1]
        value = await self._client.repo_permission(owner, repo, login)
        if len(self._entries) > 10_000:
            self._entries.clear()
        self._entries[key] = (now, value)
        return value
