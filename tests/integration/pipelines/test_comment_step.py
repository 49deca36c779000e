"""The ``gitea.comment`` step's post, exactly once, against the Gitea emulator: a retry
(the step's result lost to a crash) finds the bot's own comment by its marker and does
not post again; a comment by anyone else that quotes the marker (an agent that read a
run's marker, a user pasting it) does not pass for the step's post."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from forgeflow.domain.ids import RepoRef
from forgeflow.gitea.client import GiteaClient
from forgeflow.pipelines.adapters import GiteaAdapter
from forgeflow_testkit.gitea_emulator import GiteaEmulator

BOT = "ccweb-bot"
REPO = RepoRef("acme", "widget")
MARKER = "<!-- forgeflow pipelineStep=run-1:comment -->"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[GiteaEmulator, str, int]]:
    with GiteaEmulator(tmp_path / "gitea") as emu:
        token = emu.add_user(BOT)
        emu.add_user("mallory")
        emu.add_repo("acme", "widget")
        emu.set_permission("acme", "widget", BOT, "write")
        emu.set_permission("acme", "widget", "mallory", "read")
        number = emu.add_issue("acme", "widget", title="t", author="mallory")
        yield emu, token, number


def _post(emu: GiteaEmulator, token: str, number: int, body: str) -> int:
    async def go() -> int:
        client = GiteaClient(emu.url, token)
        try:
            return await GiteaAdapter(client, BOT).comment(REPO, number, body, marker=MARKER)
        finally:
            await client.aclose()

    return asyncio.run(go())


def _bot_bodies(emu: GiteaEmulator, number: int) -> list[str]:
    comments = emu.comments("acme", "widget", number)
    return [str(c["body"]) for c in comments if c["user"]["login"] == BOT]


def test_a_quoted_marker_is_not_the_steps_post_and_a_retry_posts_nothing(
    world: tuple[GiteaEmulator, str, int],
) -> None:
    emu, token, number = world
    forged = emu.post_comment(
        "acme", "widget", number, author="mallory", body=f"Already done.\n\n{MARKER}"
    )
    first = _post(emu, token, number, "The digest.")
    assert first != forged["id"]
    assert _bot_bodies(emu, number) == [f"The digest.\n\n{MARKER}"]
    # The step ran again (its result lost to a crash): the bot's comment is found.
    assert _post(emu, token, number, "The digest.") == first
    assert len(_bot_bodies(emu, number)) == 1
