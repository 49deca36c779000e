"""forgeflow's async client for the Gitea REST API (/api/v1), as the bot.

Its parts: the HTTP side and the errors (gitea/transport.py), issues, comments and
labels (gitea/issues.py), the repository's code and pull requests (gitea/code.py),
pull request reviews (gitea/reviews.py); here
the bot's account, the server, webhooks and the commenter's permission, and the cache
of permission answers. Every answer is a model of gitea/models.py. The token travels
only in the ``Authorization`` header; errors never include it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import quote

from forgeflow.domain.permissions import Permission
from forgeflow.gitea.code import CodeApi
from forgeflow.gitea.issues import IssuesApi
from forgeflow.gitea.models import Hook, HookOption, RepoPermission, ServerVersion, User
from forgeflow.gitea.oauth_apps import OAuthAppsApi
from forgeflow.gitea.reviews import ReviewsApi
from forgeflow.gitea.transport import GiteaError, GiteaPermissionDenied, GiteaUnavailable

__all__ = [
    "GiteaClient",
    "GiteaError",
    "GiteaPermissionDenied",
    "GiteaUnavailable",
    "PermissionCache",
]

# Gitea's GetRepoPermissions answers "owner" for the owner; we rank it like admin.
_PERMISSIONS = {
    "none": Permission.NONE,
    "read": Permission.READ,
    "write": Permission.WRITE,
    "admin": Permission.ADMIN,
    "owner": Permission.ADMIN,
}


class GiteaClient(IssuesApi, CodeApi, ReviewsApi, OAuthAppsApi):
    async def current_user(self) -> User:
        return await self._one(User, "GET", "/user", (200,))

    async def version(self) -> str:
        return (await self._one(ServerVersion, "GET", "/version", (200,))).version

    async def request_status(self, method: str, path: str, *, json: Any = None) -> int:
        """Only the status of a request (the doctor's scope probes)."""
        return (await self._request(method, path, json=json)).status_code

    async def repo_permission(self, owner: str, repo: str, login: str) -> Permission:
        """The user's access to the repository, per Gitea's collaborator-permission API."""
        path = f"{self._repo_path(owner, repo)}/collaborators/{quote(login, safe='')}/permission"
        response = await self._request("GET", path, pool=self._lookups)
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
        try:
            found = RepoPermission.model_validate_json(response.content)
        except ValueError:
            raise GiteaError(f"GET {path}: malformed RepoPermission answer", 200) from None
        return _PERMISSIONS.get(found.permission.lower(), Permission.NONE)

    # -- webhooks of a repository (``/repos/{o}/{r}``) or an organisation (``/orgs/{o}``)

    async def list_hooks(self, base: str) -> list[Hook]:
        return await self._many(Hook, "GET", f"{base}/hooks", (200,))

    async def create_hook(self, base: str, option: HookOption) -> Hook:
        body = option.create_body()
        return await self._one(Hook, "POST", f"{base}/hooks", (201,), json=body)

    async def edit_hook(self, base: str, hook_id: int, option: HookOption) -> Hook:
        path, body = f"{base}/hooks/{int(hook_id)}", option.edit_body()
        return await self._one(Hook, "PATCH", path, (200,), json=body)

    async def delete_hook(self, base: str, hook_id: int) -> None:
        # 404: already gone, which is what was asked.
        await self._no_content("DELETE", f"{base}/hooks/{int(hook_id)}", (204, 404))


class PermissionCache:
    """Caches permission answers briefly: a burst of comments costs one lookup."""

    def __init__(self, client: GiteaClient, ttl_seconds: float) -> None:
        self._client = client
        self._ttl = ttl_seconds
        self._entries: dict[tuple[str, str, str], tuple[float, Permission]] = {}
        # Look-ups under way: a burst of mentions by one commenter (a fresh cache after
        # a start) waits for the one request instead of sending its own.
        self._asking: dict[tuple[str, str, str], asyncio.Future[Permission]] = {}

    def cached(self, owner: str, repo: str, login: str) -> Permission | None:
        """The answer still fresh in the cache, or None (then :meth:`permission` asks)."""
        hit = self._entries.get((owner.lower(), repo.lower(), login.lower()))
        if hit is not None and time.monotonic() - hit[0] < self._ttl:
            return hit[1]
        return None

    async def permission(self, owner: str, repo: str, login: str) -> Permission:
        hit = self.cached(owner, repo, login)
        if hit is not None:
            return hit
        key = (owner.lower(), repo.lower(), login.lower())
        asking = self._asking.get(key)
        if asking is None:
            # A task of its own: one caller's cancellation does not cancel the others'.
            asking = self._asking[key] = asyncio.ensure_future(self._ask(key, owner, repo, login))
        return await asyncio.shield(asking)

    async def _ask(
        self, key: tuple[str, str, str], owner: str, repo: str, login: str
    ) -> Permission:
        now = time.monotonic()
        try:
            value = await self._client.repo_permission(owner, repo, login)
        finally:
            del self._asking[key]
        if len(self._entries) > 10_000:
            self._entries.clear()
        self._entries[key] = (now, value)
        return value
