"""The brokers outside the jail, over real sockets: the model pass-through against a
streaming upstream, and the Gitea tools against the real PyPI ``gitea-mcp`` talking to
the Gitea emulator."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from forgeflow.agent.broker import Broker, Grant
from forgeflow.agent.provider import ModelProvider
from forgeflow.agent.tools import GiteaTools, mcp_env
from forgeflow_testkit.gitea_emulator import GiteaEmulator

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


async def _no_tools(_grant: Grant, _message: dict[str, Any]) -> dict[str, Any] | None:
    return None


def test_the_pass_through_streams_adds_the_key_and_counts_tokens() -> None:
    asyncio.run(_pass_through())


async def _pass_through() -> None:
    upstream = Upstream()
    await upstream.start()
    broker = Broker(ModelProvider(upstream.url, KEY), _no_tools)
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
def two_repos(tmp_path: Path) -> Iterator[tuple[GiteaEmulator, str]]:
    emu = GiteaEmulator(tmp_path / "gitea-repos")
    emu.start()
    try:
        token = emu.add_user("ccweb-bot")
        for name in ("widget", "other"):
            emu.add_repo("acme", name)
            emu.set_permission("acme", name, "ccweb-bot", "admin")
            emu.add_issue("acme", name, title="t", author="ccweb-bot")
        yield emu, token
    finally:
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
    two_repos: tuple[GiteaEmulator, str],
) -> None:
    asyncio.run(_scoped_tools(*two_repos))


async def _scoped_tools(emu: GiteaEmulator, token: str) -> None:
    refused: list[tuple[str, str]] = []
    tools = GiteaTools(
        [str(GITEA_MCP)],
        mcp_env(emu.url, token),
        timeout=30,
        on_refused=lambda grant, tool, _args, why: refused.append((tool, why)),
    )
    broker = Broker(ModelProvider("http://127.0.0.1:9", None), tools.handle)
    await broker.start()
    session = broker.grant(Grant("acme/widget", "acme", "widget", session_key="s1"))
    model_only = broker.grant(Grant("acme/widget", "acme", "widget"))
    try:
        async with aiohttp.ClientSession() as http:
            url = broker.mcp_url
            listed = await _rpc(http, url, session, "tools/list", {})
            names = {t["name"] for t in listed["result"]["tools"]}
            assert "add_comment" in names and "get_issue" in names
            # Unscoped or past the session's branch: not offered.
            for hidden in ("list_repos", "get_server_version", "merge_pr", "commit_changes"):
                assert hidden not in names
            body = {"owner": "acme", "repo": "other", "issue_number": 1, "body": "leak"}
            out = await _rpc(
                http, url, session, "tools/call", {"name": "add_comment", "arguments": body}
            )
            assert out["result"]["isError"] is True
            assert "acme/widget only" in out["result"]["content"][0]["text"]
            assert emu.comments("acme", "other", 1) == []
            hidden_call = {"name": "list_repos", "arguments": {"owner": "acme"}}
            out = await _rpc(http, url, session, "tools/call", hidden_call)
            assert out["result"]["isError"] is True
            assert [t for t, _ in refused] == ["add_comment", "list_repos"]
            # Its own repository (Gitea names are case-insensitive): relayed.
            body = {"owner": "ACME", "repo": "widget", "issue_number": 1, "body": "hello"}
            out = await _rpc(
                http, url, session, "tools/call", {"name": "add_comment", "arguments": body}
            )
            assert not out["result"].get("isError"), out
            assert [c["body"] for c in emu.comments("acme", "widget", 1)] == ["hello"]
            # The model capability is not a session's: no tools with it.
            async with http.post(
                url, json={}, headers={"Authorization": f"Bearer {model_only}"}
            ) as r:
                assert r.status == 401
    finally:
        await broker.aclose()
        await tools.aclose()
