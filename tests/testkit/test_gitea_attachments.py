"""The emulator's attachments as Gitea has them (issue_attachment.go,
issue_comment_attachment.go, structs/attachment.go, web GetAttachment), and forgeflow's
client reading one with its bounds."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from forgeflow.gitea.client import GiteaClient, GiteaError
from forgeflow_testkit.gitea_emulator import GiteaEmulator

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 40


@pytest.fixture
def emu(tmp_path: Path) -> Iterator[GiteaEmulator]:
    with GiteaEmulator(tmp_path / "git") as emulator:
        yield emulator


@pytest.fixture
def tokens(emu: GiteaEmulator) -> dict[str, str]:
    """acme/widget is private: the bot reads it, bob does not."""
    found = {name: emu.add_user(name) for name in ("acme", "ccweb-bot", "alice", "bob")}
    emu.add_repo("acme", "widget", private=True)
    emu.set_permission("acme", "widget", "ccweb-bot", "admin")
    emu.set_permission("acme", "widget", "alice", "write")
    return found


def _client(emu: GiteaEmulator, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"token {token}"} if token else {}
    return httpx.Client(base_url=emu.url, headers=headers, trust_env=False)


def test_assets_on_issues_and_comments(emu: GiteaEmulator, tokens: dict[str, str]) -> None:
    index = emu.add_issue("acme", "widget", title="t", author="alice")
    comment = emu.post_comment("acme", "widget", index, author="alice", body="see")
    on_issue = emu.attach("acme", "widget", index, name="a.png", data=PNG, author="alice")
    on_comment = emu.attach(
        "acme", "widget", index, name="b.png", data=PNG, author="alice", comment_id=comment["id"]
    )
    assert set(on_issue) == {
        "id", "name", "size", "download_count", "created_at", "uuid", "browser_download_url"
    }  # fmt: skip
    assert on_issue["size"] == len(PNG)
    assert on_issue["browser_download_url"] == f"{emu.url}/attachments/{on_issue['uuid']}"
    with _client(emu, tokens["ccweb-bot"]) as http:
        issue = http.get(f"/api/v1/repos/acme/widget/issues/{index}").json()
        assert [a["uuid"] for a in issue["assets"]] == [on_issue["uuid"]]
        comments = http.get(f"/api/v1/repos/acme/widget/issues/{index}/comments").json()
        assert [a["uuid"] for a in comments[0]["assets"]] == [on_comment["uuid"]]
        listed = http.get(f"/api/v1/repos/acme/widget/issues/{index}/assets").json()
        assert [a["id"] for a in listed] == [on_issue["id"]]  # not the comment's
        path = f"/api/v1/repos/acme/widget/issues/comments/{comment['id']}/assets"
        assert [a["id"] for a in http.get(path).json()] == [on_comment["id"]]
        one = http.get(f"/api/v1/repos/acme/widget/issues/{index}/assets/{on_issue['id']}")
        assert one.json()["uuid"] == on_issue["uuid"]
        other = http.get(f"/api/v1/repos/acme/widget/issues/{index}/assets/{on_comment['id']}")
        assert other.status_code == 404


def test_the_file_needs_read_access(emu: GiteaEmulator, tokens: dict[str, str]) -> None:
    index = emu.add_issue("acme", "widget", title="t", author="alice")
    shown = emu.attach("acme", "widget", index, name="a.png", data=PNG, author="alice")
    url = f"/attachments/{shown['uuid']}"
    with _client(emu, tokens["ccweb-bot"]) as http:
        got = http.get(url)
        assert got.status_code == 200 and got.content == PNG
        assert got.headers["content-type"] == "image/png"
    for token in (tokens["bob"], None):  # no access, anonymous: GetAttachment's 404
        with _client(emu, token) as http:
            assert http.get(url).status_code == 404


def test_forgeflow_reads_an_attachment_within_its_bound(
    emu: GiteaEmulator, tokens: dict[str, str]
) -> None:
    index = emu.add_issue("acme", "widget", title="t", author="alice")
    shown = emu.attach("acme", "widget", index, name="a.png", data=PNG, author="alice")

    async def scenario() -> None:
        client = GiteaClient(emu.url, tokens["ccweb-bot"])
        try:
            assert await client.attachment(shown["uuid"], len(PNG)) == PNG
            with pytest.raises(GiteaError, match="larger than 10 bytes"):
                await client.attachment(shown["uuid"], 10)
            with pytest.raises(GiteaError, match="HTTP 404"):
                await client.attachment("00000000-0000-4000-8000-000000000000", 100)
        finally:
            await client.aclose()

    asyncio.run(scenario())
