"""A small async client for the Gitea REST API (/api/v1) as the bot.

The token travels only in the ``Authorization`` header; errors never include it.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp

from forgeflow.domain.permissions import Permission
from forgeflow.gitea.models import (
    ChangedFile,
    CombinedStatus,
    Comment,
    Issue,
    Label,
    PullRequest,
    parse_list,
)


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


# aiohttp, not httpx (the project's usual HTTP client), for this one client: on the way from
# a burst of mentions to their turns this client made ≈ 40 % of the event loop's CPU, and
# a request costs ≈ 0.15–0.2 ms of client CPU with aiohttp against 0.8–1.15 ms with httpx
# (measured on the same server and machine; httpcore's pool walks every connection and
# polls every idle socket on each request). Tasks share 16 connections; the webhook's
# permission lookups have 4 of their own, so a 202 never waits behind the tasks' requests.
_CONNECTIONS = 16
_LOOKUP_CONNECTIONS = 4


@dataclass(frozen=True, slots=True)
class Answer:
    """Gitea's answer, read whole."""

    status_code: int
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)


def _proxy_for(url: str) -> str | None:
    """The proxy HTTP(S)_PROXY / NO_PROXY name for ``url`` (as httpx applied them), or None."""
    parts = urlsplit(url)
    if parts.hostname and urllib.request.proxy_bypass(parts.hostname):
        return None
    return urllib.request.getproxies().get(parts.scheme)


class _Pool:
    """One aiohttp session (made lazily, in the loop that uses it) and its connection
    limit; the wait for a free connection counts against the timeout."""

    def __init__(
        self, connections: int, timeout: float, headers: dict[str, str], proxy: str | None
    ) -> None:
        self._connections = connections
        self.proxy = proxy
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._headers = headers
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=self._connections),
                # aiohttp's trust_env reads the environment and ~/.netrc in a thread for
                # every request; the proxy is looked up once instead (_proxy_for).
                trust_env=False,
            )
            self._loop = loop
        return self._session

    async def aclose(self) -> None:
        if self._session is not None and self._loop is asyncio.get_running_loop():
            await self._session.close()
        self._session = None


class GiteaClient:
    def __init__(self, base_url: str, token: str | None, *, timeout: float = 10.0) -> None:
        headers = {"Accept": "application/json", "User-Agent": "forgeflow"}
        if token:
            headers["Authorization"] = f"token {token}"
        self._base = base_url.rstrip("/") + "/api/v1"
        proxy = _proxy_for(base_url)
        self._pool = _Pool(_CONNECTIONS, timeout, headers, proxy)
        self._lookups = _Pool(_LOOKUP_CONNECTIONS, timeout, headers, proxy)

    async def aclose(self) -> None:
        await self._pool.aclose()
        await self._lookups.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        pool: _Pool | None = None,
        params: dict[str, str] | None = None,
        json: Any = None,
    ) -> Answer:
        pool = pool or self._pool
        try:
            async with pool.session().request(
                method,
                self._base + path,
                params=params,
                json=json,
                allow_redirects=False,
                proxy=pool.proxy,
            ) as response:
                answer = Answer(response.status, await response.read())
        except aiohttp.ClientError as exc:
            raise GiteaUnavailable(f"{method} {path}: {type(exc).__name__}") from None
        except TimeoutError:
            raise GiteaUnavailable(f"{method} {path}: timed out") from None
        if answer.status_code >= 500:
            raise GiteaUnavailable(
                f"{method} {path}: HTTP {answer.status_code}", answer.status_code
            )
        return answer

    async def repo_permission(self, owner: str, repo: str, login: str) -> Permission:
        """The user's access to the repository, per Gitea's collaborator-permission API."""
        path = (
            f"/repos/{quote(owner, safe='')}/{quote(repo, safe='')}"
            f"/collaborators/{quote(login, safe='')}/permission"
        )
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
        value = str(response.json().get("permission", "none")).lower()
        return _PERMISSIONS.get(value, Permission.NONE)

    def _repo_path(self, owner: str, repo: str) -> str:
        return f"/repos/{quote(owner, safe='')}/{quote(repo, safe='')}"

    async def _json(self, method: str, path: str, ok: tuple[int, ...], **kwargs: Any) -> Any:
        response = await self._request(method, path, **kwargs)
        if response.status_code not in ok:
            raise GiteaError(f"{method} {path}: HTTP {response.status_code}", response.status_code)
        try:
            return response.json()
        except ValueError:
            raise GiteaError(f"{method} {path}: answer is not JSON", response.status_code) from None

    async def get_pull(self, owner: str, repo: str, index: int) -> dict[str, Any]:
        pull: dict[str, Any] = await self._json(
            "GET", f"{self._repo_path(owner, repo)}/pulls/{int(index)}", (200,)
        )
        return pull

    async def get_issue(self, owner: str, repo: str, index: int) -> dict[str, Any]:
        issue: dict[str, Any] = await self._json(
            "GET", f"{self._repo_path(owner, repo)}/issues/{int(index)}", (200,)
        )
        return issue

    async def list_comments(
        self, owner: str, repo: str, index: int, *, since: datetime | None = None
    ) -> list[dict[str, Any]]:
        """Comments of an issue or pull request, oldest first (Gitea's order)."""
        params = {}
        if since is not None:
            params["since"] = since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        comments = await self._json(
            "GET",
            f"{self._repo_path(owner, repo)}/issues/{int(index)}/comments",
            (200,),
            params=params,
        )
        if not isinstance(comments, list):
            raise GiteaError("comment list is not a JSON array")
        return comments

    async def branch_head(self, owner: str, repo: str, branch: str) -> str:
        """The commit ``branch`` points to now (GET /repos/{o}/{r}/branches/{branch})."""
        found = await self._json(
            "GET", f"{self._repo_path(owner, repo)}/branches/{quote(branch, safe='/')}", (200,)
        )
        commit = found.get("commit") if isinstance(found, dict) else None
        return str((commit or {}).get("id") or "")

    async def get_repo(self, owner: str, repo: str) -> dict[str, Any]:
        """The repository (clone_url, default_branch, …), per Gitea's GET /repos/{o}/{r}."""
        found: dict[str, Any] = await self._json("GET", self._repo_path(owner, repo), (200,))
        return found

    async def add_labels(
        self, owner: str, repo: str, index: int, labels: list[str]
    ) -> list[dict[str, Any]]:
        """Add labels by name to an issue or pull request (Gitea AddIssueLabels accepts
        names since 1.19); returns the issue's labels."""
        result = await self._json(
            "POST",
            f"{self._repo_path(owner, repo)}/issues/{int(index)}/labels",
            (200,),
            json={"labels": labels},
        )
        if not isinstance(result, list):
            raise GiteaError("label list is not a JSON array")
        return result

    async def list_labels(self, owner: str, repo: str) -> list[str]:
        """The names of the repository's labels (GET /repos/{o}/{r}/labels, paged)."""
        names: list[str] = []
        for page in range(1, 51):  # 2,500 labels: more than any repository has
            found = await self._json(
                "GET",
                f"{self._repo_path(owner, repo)}/labels",
                (200,),
                params={"page": str(page), "limit": "50"},
            )
            if not isinstance(found, list):
                raise GiteaError("label list is not a JSON array")
            names += [str(x.get("name")) for x in found if isinstance(x, dict)]
            if len(found) < 50:
                break
        return names

    async def create_label(
        self, owner: str, repo: str, name: str, *, color: str, description: str
    ) -> None:
        """Gitea CreateLabel (POST /repos/{o}/{r}/labels, CreateLabelOption)."""
        await self._json(
            "POST",
            f"{self._repo_path(owner, repo)}/labels",
            (201,),
            json={"name": name, "color": color, "description": description},
        )

    async def create_comment(self, owner: str, repo: str, index: int, body: str) -> dict[str, Any]:
        comment: dict[str, Any] = await self._json(
            "POST",
            f"{self._repo_path(owner, repo)}/issues/{int(index)}/comments",
            (201,),
            json={"body": body},
        )
        return comment

    async def edit_comment(
        self, owner: str, repo: str, comment_id: int, body: str
    ) -> dict[str, Any]:
        comment: dict[str, Any] = await self._json(
            "PATCH",
            f"{self._repo_path(owner, repo)}/issues/comments/{int(comment_id)}",
            (200,),
            json={"body": body},
        )
        return comment

    # -- the agent's tools (agent/gitea_tools): typed answers, bounded reads -----------

    async def comments_page(
        self, owner: str, repo: str, index: int, *, page: int, limit: int
    ) -> list[Comment]:
        """One page of an issue's comments, oldest first (Gitea ListIssueComments)."""
        found = await self._json(
            "GET",
            f"{self._repo_path(owner, repo)}/issues/{int(index)}/comments",
            (200,),
            params={"page": str(int(page)), "limit": str(int(limit))},
        )
        return _typed(Comment, found)

    async def comment(self, owner: str, repo: str, comment_id: int) -> Comment:
        found = await self._json(
            "GET", f"{self._repo_path(owner, repo)}/issues/comments/{int(comment_id)}", (200,)
        )
        return Comment.model_validate(found)

    async def search_issues(
        self, owner: str, repo: str, *, query: str, state: str, kind: str, page: int, limit: int
    ) -> list[Issue]:
        """Gitea ListIssues with ``q`` (keyword search), ``state`` and ``type``."""
        params = {"state": state, "page": str(int(page)), "limit": str(int(limit))}
        if query:
            params["q"] = query
        if kind != "all":
            params["type"] = kind
        found = await self._json(
            "GET", f"{self._repo_path(owner, repo)}/issues", (200,), params=params
        )
        return _typed(Issue, found)

    async def pull(self, owner: str, repo: str, index: int) -> PullRequest:
        return PullRequest.model_validate(await self.get_pull(owner, repo, index))

    async def issue(self, owner: str, repo: str, index: int) -> Issue:
        return Issue.model_validate(await self.get_issue(owner, repo, index))

    async def open_pulls(self, owner: str, repo: str, *, limit: int = 50) -> list[PullRequest]:
        found = await self._json(
            "GET",
            f"{self._repo_path(owner, repo)}/pulls",
            (200,),
            params={"state": "open", "limit": str(int(limit))},
        )
        return _typed(PullRequest, found)

    async def pull_files(
        self, owner: str, repo: str, index: int, *, limit: int
    ) -> list[ChangedFile]:
        found = await self._json(
            "GET",
            f"{self._repo_path(owner, repo)}/pulls/{int(index)}/files",
            (200,),
            params={"limit": str(int(limit))},
        )
        return _typed(ChangedFile, found)

    async def pull_diff(self, owner: str, repo: str, index: int) -> bytes:
        """The pull request's diff (Gitea GET /repos/{o}/{r}/pulls/{index}.diff)."""
        path = f"{self._repo_path(owner, repo)}/pulls/{int(index)}.diff"
        return await self._bytes(path, None)

    async def raw_file(self, owner: str, repo: str, path: str, ref: str) -> bytes:
        """A file's bytes at ``ref`` (Gitea GetRawFile). ``path``: already checked
        segments (agent/gitea_tools/args.py); each is percent-encoded here again."""
        encoded = "/".join(quote(part, safe="") for part in path.split("/"))
        return await self._bytes(f"{self._repo_path(owner, repo)}/raw/{encoded}", {"ref": ref})

    async def _bytes(self, path: str, params: dict[str, str] | None) -> bytes:
        answer = await self._request("GET", path, params=params)
        if answer.status_code != 200:
            raise GiteaError(f"GET {path}: HTTP {answer.status_code}", answer.status_code)
        return answer.content

    async def create_pull(
        self, owner: str, repo: str, *, head: str, base: str, title: str, body: str
    ) -> PullRequest:
        found = await self._json(
            "POST",
            f"{self._repo_path(owner, repo)}/pulls",
            (201,),
            json={"head": head, "base": base, "title": title, "body": body},
        )
        return PullRequest.model_validate(found)

    async def edit_pull(
        self, owner: str, repo: str, index: int, changes: dict[str, str]
    ) -> PullRequest:
        found = await self._json(
            "PATCH", f"{self._repo_path(owner, repo)}/pulls/{int(index)}", (201,), json=changes
        )
        return PullRequest.model_validate(found)

    async def repo_labels(self, owner: str, repo: str) -> list[Label]:
        found = await self._json(
            "GET", f"{self._repo_path(owner, repo)}/labels", (200,), params={"limit": "50"}
        )
        return _typed(Label, found)

    async def remove_label(self, owner: str, repo: str, index: int, label_id: int) -> None:
        path = f"{self._repo_path(owner, repo)}/issues/{int(index)}/labels/{int(label_id)}"
        answer = await self._request("DELETE", path)
        if answer.status_code != 204:
            raise GiteaError(f"DELETE {path}: HTTP {answer.status_code}", answer.status_code)

    async def combined_status(self, owner: str, repo: str, ref: str) -> CombinedStatus:
        """Gitea GetCombinedCommitStatusByRef (GET /repos/{o}/{r}/commits/{ref}/status)."""
        found = await self._json(
            "GET", f"{self._repo_path(owner, repo)}/commits/{quote(ref, safe='')}/status", (200,)
        )
        return CombinedStatus.model_validate(found)

    async def current_user(self) -> dict[str, Any]:
        user: dict[str, Any] = await self._json("GET", "/user", (200,))
        return user

    async def version(self) -> str:
        body = await self._json("GET", "/version", (200,))
        return str(body.get("version", ""))

    async def request_status(self, method: str, path: str, *, json: Any = None) -> int:
        """Only the status of a request (the doctor's scope probes)."""
        return (await self._request(method, path, json=json)).status_code

    async def list_hooks(self, base: str) -> list[dict[str, Any]]:
        hooks = await self._json("GET", f"{base}/hooks", (200,))
        return list(hooks) if isinstance(hooks, list) else []

    async def create_hook(self, base: str, body: dict[str, Any]) -> dict[str, Any]:
        hook: dict[str, Any] = await self._json("POST", f"{base}/hooks", (201,), json=body)
        return hook

    async def edit_hook(self, base: str, hook_id: int, body: dict[str, Any]) -> dict[str, Any]:
        hook: dict[str, Any] = await self._json(
            "PATCH", f"{base}/hooks/{int(hook_id)}", (200,), json=body
        )
        return hook

    async def delete_hook(self, base: str, hook_id: int) -> None:
        response = await self._request("DELETE", f"{base}/hooks/{int(hook_id)}")
        if response.status_code not in (204, 404):
            raise GiteaError(
                f"DELETE hook {hook_id}: HTTP {response.status_code}", response.status_code
            )


def _typed(model: Any, found: Any) -> list[Any]:
    try:
        return parse_list(model, found)
    except ValueError as exc:
        raise GiteaError(f"malformed answer: {str(exc)[:200]}") from None


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
