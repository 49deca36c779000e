from __future__ import annotations

import pytest

from forgeflow.domain.mentions import Command, find_mention

BOT = "ccweb-bot"


@pytest.mark.parametrize(
    ("text", "instruction"),
    [
        ("@ccweb-bot please fix the flaky test", "please fix the flaky test"),
        ("Hey @ccweb-bot, fix it.", "fix it."),
        ("@CCWEB-BOT do it", "do it"),
        ("line one\n@ccweb-bot\nmulti\nline", "multi\nline"),
        ("(@ccweb-bot) look", "look"),
        ("@ccweb-bot", ""),
        ("> @ccweb-bot old\n@ccweb-bot new", "new"),
        ("`@ccweb-bot` is the bot; @ccweb-bot run it", "run it"),
        ("```\n@ccweb-bot inside\n```\n@ccweb-bot outside", "outside"),
        ("@ccweb-bot.", ""),
    ],
)
def test_mentions_found(text: str, instruction: str) -> None:
    mention = find_mention(text, BOT)
    assert mention is not None
    assert mention.instruction == instruction


@pytest.mark.parametrize(
    "text",
    [
        "no mention here",
        "mail me at me@ccweb-bot.example",
        "foo@ccweb-bot",
        "@ccweb-bot-2 is another account",
        "@ccweb-bot_old is another account",
        "@ccweb-bot.old is another account",
        "`@ccweb-bot` only in code",
        "``code with @ccweb-bot inside``",
        "> @ccweb-bot quoted reply",
        "   > @ccweb-bot quoted reply, indented",
        "```python\n@ccweb-bot in a fence\n```",
        "~~~\n@ccweb-bot in a tilde fence\n~~~",
        "````\n```\n@ccweb-bot nested fence\n```\n````",
        "see https://gitea.example/@ccweb-bot",
        "",
    ],
)
def test_not_a_mention(text: str) -> None:
    assert find_mention(text, BOT) is None


def test_unclosed_fence_hides_the_rest() -> None:
    assert find_mention("```\n@ccweb-bot never closed", BOT) is None


@pytest.mark.parametrize(
    ("text", "command"),
    [
        ("@ccweb-bot stop", Command.STOP),
        ("@ccweb-bot Status", Command.STATUS),
        ("@ccweb-bot new   session", Command.NEW_SESSION),
        ("@ccweb-bot stop the build from failing", None),
    ],
)
def test_commands(text: str, command: Command | None) -> None:
    mention = find_mention(text, BOT)
    assert mention is not None
    assert mention.command == command
