"""What a signed-in person may see and do, per repository.

An operator (the admin token, or a Gitea user the operator made one) sees everything. A
Gitea user sees a repository's tasks, sessions, transcripts and pushes while Gitea says
they can read it, asked with the user's own token (``GET /repos/{owner}/{repo}``) and
reused for ``oauth_access_cache_seconds``: each page asks again once that is over, so a
removed collaborator loses the pages within that time. What they cannot see is not
found, never forbidden: a task's id tells nothing of a repository they cannot read.
Controls on a task need write permission there.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from fastapi import Request

from forgeflow.domain.ids import InvalidName, parse_repo_key
from forgeflow.domain.oauth import Tokens
from forgeflow.domain.permissions import Permission
from forgeflow.gitea.oauth import OAuthClient, TokenInvalid, TokenRefused
from forgeflow.gitea.transport import GiteaError
from forgeflow.services import Services
from forgeflow.store import gitea_logins, repos, ui_sessions
from forgeflow.web.sealing import seal, unseal
from forgeflow.web.security import (
    Forbidden,
    NotFound,
    SignInRequired,
    UiSession,
    Unavailable,
)

# Refresh a token this long before Gitea says it expires.
REFRESH_MARGIN = 60.0
MAX_CACHED = 20_000
LOOKUPS_AT_ONCE = 8


@dataclass
class AccessCache:
    """Gitea's answers per (sign-in session, repository), for a short while."""

    seconds: float
    answers: dict[tuple[str, str], tuple[Permission, float]] = field(default_factory=dict)

    def get(self, sid: str, repo_key: str) -> Permission | None:
        found = self.answers.get((sid, repo_key))
        if found is None or found[1] <= time.monotonic():
            return None
        return found[0]

    def put(self, sid: str, repo_key: str, permission: Permission) -> None:
        if len(self.answers) >= MAX_CACHED:
            now = time.monotonic()
            self.answers = {k: v for k, v in self.answers.items() if v[1] > now}
            if len(self.answers) >= MAX_CACHED:
                self.answers.clear()
        self.answers[(sid, repo_key)] = (permission, time.monotonic() + self.seconds)


def _cache(request: Request, services: Services) -> AccessCache:
    cache = getattr(request.app.state, "gitea_access", None)
    if not isinstance(cache, AccessCache):
        cache = AccessCache(services.settings.oauth_access_cache_seconds)
        request.app.state.gitea_access = cache
    cache.seconds = services.settings.oauth_access_cache_seconds  # the setting of now
    return cache


def _services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


async def _signed_out(request: Request, session: UiSession) -> SignInRequired:
    """The user's token no longer works: the session ends, the person signs in again."""
    sid = session.session_id
    await _services(request).store.write(lambda c: ui_sessions.end(c, sid, session.actor))
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return SignInRequired(target)


async def _token(request: Request, session: UiSession, client: OAuthClient) -> str:
    """The user's access token, refreshed when it is (nearly) expired."""
    services = _services(request)
    sid = session.session_id
    row = await services.store.read(lambda c: gitea_logins.get(c, sid))
    tokens = unseal(services.admin_token, row.sealed_tokens) if row else None
    if tokens is None:
        raise await _signed_out(request, session)
    if tokens.expires_at - REFRESH_MARGIN > time.time():
        return tokens.access_token
    try:
        fresh: Tokens = await client.refresh(tokens.refresh_token)
    except TokenRefused:
        raise await _signed_out(request, session) from None
    except GiteaError as exc:
        raise Unavailable(f"Gitea cannot be asked now ({exc.status or 'unreachable'})") from None
    sealed = seal(services.admin_token, fresh)
    await services.store.write(lambda c: gitea_logins.reseal(c, sid, sealed))
    return fresh.access_token


async def permission(request: Request, session: UiSession, repo_key: str) -> Permission:
    """The person's permission on one repository (an operator: admin everywhere)."""
    return (await permissions(request, session, [repo_key]))[repo_key]


async def permissions(
    request: Request, session: UiSession, repo_keys: list[str]
) -> dict[str, Permission]:
    if session.operator_rights:
        return dict.fromkeys(repo_keys, Permission.ADMIN)
    services = _services(request)
    client = services.oauth
    if client is None:  # Sign in with Gitea was switched off since: nothing to ask
        raise await _signed_out(request, session)
    cache = _cache(request, services)
    sid = session.session_id
    found = {k: p for k in repo_keys if (p := cache.get(sid, k)) is not None}
    missing = [k for k in repo_keys if k not in found]
    if not missing:
        return found
    token = await _token(request, session, client)
    limit = asyncio.Semaphore(LOOKUPS_AT_ONCE)

    async def _ask(repo_key: str) -> None:
        try:
            ref = parse_repo_key(repo_key)
        except InvalidName:
            found[repo_key] = Permission.NONE
            return
        async with limit:
            answer = await client.access(token, ref.owner, ref.name)
        cache.put(sid, repo_key, answer)
        found[repo_key] = answer

    try:
        await asyncio.gather(*(_ask(k) for k in missing))
    except TokenInvalid:
        raise await _signed_out(request, session) from None
    except GiteaError as exc:
        raise Unavailable(f"Gitea cannot be asked now ({exc.status or 'unreachable'})") from None
    return found


async def readable(request: Request, session: UiSession) -> frozenset[str] | None:
    """The repositories whose work the person may see; None: all (an operator)."""
    if session.operator_rights:
        return None
    known = await _services(request).store.read(repos.list_all)
    answers = await permissions(request, session, [r.repo_key for r in known])
    return frozenset(k for k, p in answers.items() if p.allows(Permission.READ))


async def require_read(request: Request, session: UiSession, repo_key: str, what: str) -> None:
    if not (await permission(request, session, repo_key)).allows(Permission.READ):
        raise NotFound(what)


async def require_write(request: Request, session: UiSession, repo_key: str, what: str) -> None:
    """Controls on a repository's task: not found unreadable, forbidden below write."""
    found = await permission(request, session, repo_key)
    if not found.allows(Permission.READ):
        raise NotFound(what)
    if not found.allows(Permission.WRITE):
        raise Forbidden(f"controls on {repo_key} need write permission on it in Gitea")
