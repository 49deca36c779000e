"""The HTTP side of forgeflow's Gitea client: the connection pools, one request, and the
errors every Gitea call raises.

The token travels only in the ``Authorization`` header; errors never include it (they
name the method, the path and the status).
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import aiohttp
from pydantic import BaseModel, ValidationError


class GiteaError(Exception):
    """Gitea answered with an error or could not be reached."""

    code = "gitea_error"

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class GiteaUnavailable(GiteaError):
    code = "gitea_unavailable"


class GiteaAnswerTooLarge(GiteaError):
    """A JSON answer past :data:`MAX_ANSWER_BYTES`, read no further."""

    code = "gitea_answer_too_large"


# What an answer read with this bound may weigh (a review's line comments: one unpaged
# answer, and bodies have no size limit on Gitea, so a reader's review of 200 long line
# comments was hundreds of MB here). Answers whose loss would fail a task (an issue's
# timeline, read for verification) are still read whole.
MAX_ANSWER_BYTES = 32 * 1024 * 1024


class GiteaPermissionDenied(GiteaError):
    code = "permission_check_forbidden"


# aiohttp, not httpx (the project's usual HTTP client), for this one client: on the way from
# a burst of mentions to their turns this client made ≈ 40 % of the event loop's CPU, and
# a request costs ≈ 0.15–0.2 ms of client CPU with aiohttp against 0.8–1.15 ms with httpx
# (measured on the same server and machine; httpcore's pool walks every connection and
# polls every idle socket on each request). Tasks share 16 connections; the webhook's
# permission lookups have 4 of their own, so a 202 never waits behind the tasks' requests.
CONNECTIONS = 16
LOOKUP_CONNECTIONS = 4

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class Answer:
    """Gitea's answer, read whole."""

    status_code: int
    content: bytes
    total: int | None = None  # a list's X-Total-Count (Gitea's count of every page)

    def json(self) -> Any:
        return json.loads(self.content)


def proxy_for(url: str) -> str | None:
    """The proxy HTTP(S)_PROXY / NO_PROXY name for ``url`` (as httpx applied them), or None."""
    parts = urlsplit(url)
    if parts.hostname and urllib.request.proxy_bypass(parts.hostname):
        return None
    return urllib.request.getproxies().get(parts.scheme)


class Pool:
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
                # every request; the proxy is looked up once instead (proxy_for).
                trust_env=False,
            )
            self._loop = loop
        return self._session

    async def aclose(self) -> None:
        if self._session is not None and self._loop is asyncio.get_running_loop():
            await self._session.close()
        self._session = None


class _TooLarge(Exception):
    pass


async def _read(response: aiohttp.ClientResponse, limit: int | None) -> bytes:
    """The answer's body, whole, or at most ``limit`` bytes (past them: _TooLarge)."""
    if limit is None:
        return await response.read()
    if (response.content_length or 0) > limit:
        raise _TooLarge
    body = bytearray()
    async for chunk in response.content.iter_chunked(64 * 1024):
        body += chunk
        if len(body) > limit:
            raise _TooLarge
    return bytes(body)


class Transport:
    """Requests to Gitea's /api/v1 as the bot, and their answers read as models (the
    client's parts, gitea/issues.py and gitea/code.py, are built on it)."""

    def __init__(self, base_url: str, token: str | None, *, timeout: float = 10.0) -> None:
        headers = {"Accept": "application/json", "User-Agent": "forgeflow"}
        if token:
            headers["Authorization"] = f"token {token}"
        self._root = base_url.rstrip("/")
        self._base = self._root + "/api/v1"
        proxy = proxy_for(base_url)
        self._pool = Pool(CONNECTIONS, timeout, headers, proxy)
        self._lookups = Pool(LOOKUP_CONNECTIONS, timeout, headers, proxy)

    async def aclose(self) -> None:
        await self._pool.aclose()
        await self._lookups.aclose()

    @staticmethod
    def _repo_path(owner: str, repo: str) -> str:
        return f"/repos/{quote(owner, safe='')}/{quote(repo, safe='')}"

    async def _request(
        self,
        method: str,
        path: str,
        *,
        pool: Pool | None = None,
        params: dict[str, str] | None = None,
        json: Any = None,
        max_bytes: int | None = None,
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
                count = response.headers.get("X-Total-Count", "")
                total = int(count) if count.isdigit() else None
                answer = Answer(response.status, await _read(response, max_bytes), total)
        except aiohttp.ClientError as exc:
            raise GiteaUnavailable(f"{method} {path}: {type(exc).__name__}") from None
        except TimeoutError:
            raise GiteaUnavailable(f"{method} {path}: timed out") from None
        except _TooLarge:
            raise GiteaAnswerTooLarge(f"{method} {path}: over {max_bytes} bytes") from None
        if answer.status_code >= 500:
            raise GiteaUnavailable(
                f"{method} {path}: HTTP {answer.status_code}", answer.status_code
            )
        return answer

    async def _json(self, method: str, path: str, ok: tuple[int, ...], **kwargs: Any) -> Any:
        return (await self._json_counted(method, path, ok, **kwargs))[0]

    async def _json_counted(
        self, method: str, path: str, ok: tuple[int, ...], **kwargs: Any
    ) -> tuple[Any, int | None]:
        """Gitea's JSON answer, with a list's total when Gitea says it."""
        response = await self._request(method, path, **kwargs)
        if response.status_code not in ok:
            raise GiteaError(f"{method} {path}: HTTP {response.status_code}", response.status_code)
        try:
            return response.json(), response.total
        except ValueError:
            raise GiteaError(f"{method} {path}: answer is not JSON", response.status_code) from None

    async def _one(
        self, model: type[M], method: str, path: str, ok: tuple[int, ...], **kwargs: Any
    ) -> M:
        """Gitea's answer as one ``model``; another shape is a malformed answer."""
        found = await self._json(method, path, ok, **kwargs)
        try:
            return model.model_validate(found)
        except ValidationError as exc:
            raise _malformed(method, path, model, exc) from None

    async def _many(
        self, model: type[M], method: str, path: str, ok: tuple[int, ...], **kwargs: Any
    ) -> list[M]:
        """Gitea's answer as a JSON array of ``model``."""
        return (await self._counted(model, method, path, ok, **kwargs))[0]

    async def _counted(
        self, model: type[M], method: str, path: str, ok: tuple[int, ...], **kwargs: Any
    ) -> tuple[list[M], int | None]:
        """Gitea's answer as a JSON array of ``model``, with the list's total when Gitea
        says it (``X-Total-Count``)."""
        found, total = await self._json_counted(method, path, ok, **kwargs)
        if not isinstance(found, list):
            raise GiteaError(f"{method} {path}: answer is not a JSON array of {model.__name__}")
        try:
            return [model.model_validate(item) for item in found], total
        except ValidationError as exc:
            raise _malformed(method, path, model, exc) from None

    async def _bytes(self, path: str, params: dict[str, str] | None, limit: int) -> bytes:
        """A raw answer (a file, a diff) read as it streams, at most ``limit`` bytes and
        one more when there are more (so the caller can say it was cut). Never read
        whole: Gitea has no size limit on either, and text that git compresses to a few
        hundred KB in a push (a pull request's, or one the agent had forgeflow push)
        is hundreds of MB here, in forgeflow's memory, which no jail bounds."""
        try:
            async with self._pool.session().get(
                self._base + path, params=params, allow_redirects=False, proxy=self._pool.proxy
            ) as response:
                if response.status >= 500:
                    raise GiteaUnavailable(f"GET {path}: HTTP {response.status}", response.status)
                if response.status != 200:
                    raise GiteaError(f"GET {path}: HTTP {response.status}", response.status)
                body = bytearray()
                async for chunk in response.content.iter_chunked(64 * 1024):
                    body += chunk
                    if len(body) > limit:
                        break  # the connection is closed, not drained
                return bytes(body[: limit + 1])
        except aiohttp.ClientError as exc:
            raise GiteaUnavailable(f"GET {path}: {type(exc).__name__}") from None
        except TimeoutError:
            raise GiteaUnavailable(f"GET {path}: timed out") from None

    async def attachment(self, uuid: str, limit: int) -> bytes:
        """An attachment's bytes from ``<gitea>/attachments/<uuid>`` (the route Gitea
        lets a token read, services/auth ``isAttachmentDownload``), at most ``limit``
        of them. Never a redirect: with object storage's ServeDirect Gitea answers with
        one, and the token is not sent anywhere but the configured Gitea."""
        path = f"/attachments/{quote(uuid, safe='')}"
        try:
            async with self._pool.session().get(
                self._root + path, allow_redirects=False, proxy=self._pool.proxy
            ) as response:
                if response.status != 200:
                    raise GiteaError(f"GET {path}: HTTP {response.status}", response.status)
                if (response.content_length or 0) > limit:
                    raise GiteaError(f"GET {path}: larger than {limit} bytes")
                body = bytearray()
                async for chunk in response.content.iter_chunked(64 * 1024):
                    body += chunk
                    if len(body) > limit:
                        raise GiteaError(f"GET {path}: larger than {limit} bytes")
                return bytes(body)
        except aiohttp.ClientError as exc:
            raise GiteaUnavailable(f"GET {path}: {type(exc).__name__}") from None
        except TimeoutError:
            raise GiteaUnavailable(f"GET {path}: timed out") from None

    async def _no_content(self, method: str, path: str, ok: tuple[int, ...]) -> None:
        answer = await self._request(method, path)
        if answer.status_code not in ok:
            raise GiteaError(f"{method} {path}: HTTP {answer.status_code}", answer.status_code)


def _malformed(method: str, path: str, model: type[BaseModel], exc: ValidationError) -> GiteaError:
    # Only where the answer differs, not the values (an answer may quote what was sent).
    where = ", ".join(".".join(str(p) for p in e["loc"]) or "(root)" for e in exc.errors()[:3])
    return GiteaError(f"{method} {path}: malformed {model.__name__} answer ({where})")
