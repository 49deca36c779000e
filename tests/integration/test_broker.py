"""The brokers outside the jail, over real sockets: the model pass-through against a
streaming upstream, and the Gitea tools (forgeflow's own, and the opt-in PyPI
``gitea-mcp``) against the Gitea emulator, called with the ``mcp`` SDK's client."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp import web
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client

from forgeflow.agent.broker import Broker, Grant
from forgeflow.agent.gitea_tools import GiteaTools
from forgeflow.agent.gitea_tools.external import External, mcp_env
from forgeflow.agent.provider import ModelProvider
from forgeflow.domain.ids import RepoRef, ResourceKind, ResourceRef
from forgeflow.gitea.client import GiteaClient
from forgeflow.store import Store
from forgeflow.tasks.tool_comments import ToolComments
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.running import running_task

GITEA_MCP = Path(sys.executable).parent / "gitea-mcp"
KEY = "sk-operator-key"


class Upstream:
    """A Responses-API stand-in that streams one event, then waits for ``release``."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.seen_auth: list[str] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/responses", self._responses)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        self.seen_auth.append(request.headers.get("Authorization", ""))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'event: response.created\ndata: {"type":"response.created"}\n\n')
        await self.release.wait()
        done = {
            "type": "response.completed",
            "response": {"usage": {"input_tokens": 120, "output_tokens": 7}},
        }
        line = f"event: response.completed\ndata: {json.dumps(done)}\n\n".encode()
        # Split inside the line: the count must not depend on how chunks fall.
        await response.write(line[:30])
        await asyncio.sleep(0.05)
        await response.write(line[30:])
        await response.write_eof()
        return response


def _no_tools() -> GiteaTools:
    return GiteaTools(GiteaClient("http://127.0.0.1:9", None), "bot", on_refused=_ignore)


def _ignore(*_args: Any) -> None:
    return None


def test_the_pass_through_streams_adds_the_key_and_counts_tokens() -> None:
    asyncio.run(_pass_through())


async def _pass_through() -> None:
    upstream = Upstream()
    await upstream.start()
    broker = Broker(ModelProvider(upstream.url, KEY), _no_tools())
    await broker.start()
    grant = Grant("acme/widget", "acme", "widget")
    capability = broker.grant(grant)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"{broker.model_url}/responses",
                json={"model": "m", "stream": True},
                headers={"Authorization": f"Bearer {capability}"},
            ) as r:
                assert r.status == 200
                # The first event arrives while the upstream still holds its answer back:
                # nothing is buffered whole.
                first = await asyncio.wait_for(r.content.readline(), 5)
                assert first.startswith(b"event: response.created")
                assert grant.usage.input_tokens == 0
                upstream.release.set()
                rest = await r.read()
            assert b"response.completed" in rest
            assert upstream.seen_auth == [f"Bearer {KEY}"]  # the operator's key, not ours
            assert (grant.usage.requests, grant.usage.input_tokens) == (1, 120)
            assert grant.usage.output_tokens == 7
            # No capability, a made-up one, or a revoked one: refused before the upstream.
            for header in ({}, {"Authorization": "Bearer made-up"}):
                async with http.post(f"{broker.model_url}/responses", headers=header) as r:
                    assert r.status == 401
            broker.revoke("acme/widget")
            async with http.post(
                f"{broker.model_url}/responses",
                json={},
                headers={"Authorization": f"Bearer {capability}"},
            ) as r:
                assert r.status == 401
            assert len(upstream.seen_auth) == 1
    finally:
        await broker.aclose()
        await upstream.stop()


@pytest.fixture
def two_repos(tmp_path: Path, sqlite_url: str) -> Iterator[tuple[GiteaEmulator, str, Store]]:
    emu = GiteaEmulator(tmp_path / "gitea-repos")
    emu.start()
    store = Store(sqlite_url)
    store.migrate()
    try:
        token = emu.add_user("ccweb-bot")
        for name in ("widget", "other"):
            emu.add_repo("acme", name)
            emu.set_permission("acme", name, "ccweb-bot", "admin")
            emu.add_issue("acme", name, title="t", author="ccweb-bot")
        # The session's turn runs: the comment tools record their comments as its task's.
        running_task(
            store,
            "gitea-task-broker",
            ResourceRef(RepoRef("acme", "widget"), ResourceKind.ISSUE, 1),
        )
        yield emu, token, store
    finally:
        store.close()
        emu.stop()


async def _rpc(
    http: aiohttp.ClientSession, url: str, capability: str, method: str, params: dict[str, Any]
) -> dict[str, Any]:
    message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    async with http.post(url, json=message, headers={"Authorization": f"Bearer {capability}"}) as r:
        assert r.status == 200, await r.text()
        answer: dict[str, Any] = await r.json()
        return answer


def test_the_gitea_tools_are_scoped_to_the_sessions_repository(
    two_repos: tuple[GiteaEmulator, str, Store],
) -> None:
    asyncio.run(_scoped_tools(*two_repos, external=False))


def test_the_external_server_passes_the_same_scope_rules(
    two_repos: tuple[GiteaEmulator, str, Store],
) -> None:
    asyncio.run(_scoped_tools(*two_repos, external=True))


async def _call(session: ClientSession, name: str, args: dict[str, Any]) -> tuple[bool, str]:
    result = await session.call_tool(name, args)
    text = "".join(c.text for c in result.content if isinstance(c, types.TextContent))
    return result.isError, text


async def _scoped_tools(emu: GiteaEmulator, token: str, store: Store, *, external: bool) -> None:
    refused: list[tuple[str, str]] = []
    gitea = GiteaClient(emu.url, token)
    outside = External([str(GITEA_MCP)], mcp_env(emu.url, token), timeout=30) if external else None
    tools = GiteaTools(
        gitea,
        "ccweb-bot",
        on_refused=lambda grant, tool, _args, why: refused.append((tool, why)),
        comments=ToolComments(store, gitea, "ccweb-bot"),
        external=outside,
    )
    broker = Broker(ModelProvider("http://127.0.0.1:9", None), tools)
    await broker.start()
    key = "default:acme/widget:issue:1"
    session_cap = broker.grant(Grant("acme/widget", "acme", "widget", session_key=key))
    model_only = broker.grant(Grant("acme/widget", "acme", "widget"))
    headers = {"Authorization": f"Bearer {session_cap}"}
    try:
        async with (
            httpx.AsyncClient(headers=headers, timeout=60) as client,
            streamable_http_client(broker.mcp_url, http_client=client) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            names = {t.name for t in (await session.list_tools()).tools}
            assert {"add_comment", "get_issue", "read_file", "push_branch"} - names == {
                "push_branch"  # no publisher was given
            }
            if external:
                # Unscoped or past the session's branch: not offered; scoped ones are.
                assert {"list_issues", "get_pull_request"} <= names, names
                for hidden in ("list_repos", "get_server_version", "merge_pr", "commit_changes"):
                    assert hidden not in names
                await _external_calls(session, emu, names)
            # Own tools take no repository at all: naming one is an unknown argument.
            err, text = await _call(session, "add_comment", {"body": "x", "owner": "acme"})
            assert err and "owner" in text and "Extra inputs" in text
            for crafted in ("../../other/repo", "a/%2F../b", "/etc/passwd", "http://x/y", "a\\b"):
                err, text = await _call(session, "read_file", {"path": crafted})
                assert err and text.startswith("refused: invalid arguments: path"), text
            err, text = await _call(session, "read_file", {"path": "README.md", "ref": "main..x"})
            assert err and "ref" in text
            err, text = await _call(session, "add_comment", {"body": "hello"})
            assert not err and json.loads(text)["id"] > 0
            assert [c["body"] for c in emu.comments("acme", "widget", 1)][-1] == "hello"
            assert emu.comments("acme", "other", 1) == []
        assert len(refused) >= 7
        # The model capability is not a session's: no tools with it.
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                broker.mcp_url, json={}, headers={"Authorization": f"Bearer {model_only}"}
            ) as r,
        ):
            assert r.status == 401
    finally:
        await broker.aclose()
        await gitea.aclose()


async def _external_calls(session: ClientSession, emu: GiteaEmulator, names: set[str]) -> None:
    tool = "get_pull_request"
    other = {"owner": "acme", "repo": "other", "pull_number": 1}
    err, text = await _call(session, tool, other)
    assert err and "acme/widget only" in text
    # A value that would climb out of the repository in the URL path.
    for crafted in ("../../acme/other", "1%2F..", "widget/../other", "http://evil/x"):
        crafted_args = {"owner": "acme", "repo": "widget", "pull_number": crafted}
        err, text = await _call(session, tool, crafted_args)
        assert err and text.startswith("refused:"), (crafted, text)
    # Its own repository (case-insensitive): relayed.
    err, text = await _call(session, "list_issues", {"owner": "ACME", "repo": "widget"})
    assert not err and "t" in text, text
