"""docs/commands.md against the parser (domain/mentions.py, domain/options.py): every
comment command and option the page lists parses as it says, every one the parser knows
is on the page, and the page's examples read as the page says they do."""

from __future__ import annotations

import re

from forgeflow.domain import options as opts
from forgeflow.domain.mentions import Command, find_mention
from tests.support import docs

BOT = "ccweb-bot"  # the default FORGEFLOW_BOT_LOGIN, which the docs write


def _page() -> str:
    return docs.read("docs/commands.md")


def _section(title: str) -> str:
    return _page().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_every_command_in_the_table_parses_and_every_command_is_in_it() -> None:
    parsed = {}
    for row in docs.table_rows(_section("In a Gitea comment")):
        cell = row[0].strip("`")
        if cell.startswith(f"@{BOT} "):
            mention = find_mention(cell, BOT)
            assert mention is not None and mention.command is not None, cell
            parsed[mention.command] = cell
    assert set(parsed) == set(Command), f"documented {sorted(parsed)}, parsed {list(Command)}"


def test_every_command_is_audited_under_the_name_the_page_gives() -> None:
    for command in Command:
        assert f"`command.{command.value.replace(' ', '_')}`" in _page(), command


def test_a_command_is_the_whole_instruction_as_the_page_says() -> None:
    assert "whole instruction" in _section("In a Gitea comment")
    stop = find_mention(f"@{BOT} Stop.", BOT)
    assert stop is not None and stop.command is Command.STOP
    prose = find_mention(f"@{BOT} stop the flaky build", BOT)
    assert prose is not None and prose.command is None


def test_review_parses_with_and_without_a_focus() -> None:
    assert f"`@{BOT} review [focus]`" in _page()
    bare = find_mention(f"@{BOT} review", BOT)
    focused = find_mention(f"@{BOT} review the error handling", BOT)
    assert bare is not None and bare.review_focus == ""
    assert focused is not None and focused.review_focus == "the error handling"
    assert bare.command is None


def test_mentions_the_page_says_do_not_count_do_not() -> None:
    assert find_mention(f"see `@{BOT}` here", BOT) is None
    assert find_mention(f"@{BOT}-2 please fix it", BOT) is None
    assert find_mention(f"> @{BOT} please fix it", BOT) is None
    assert find_mention(f"mail {BOT}@example.org", BOT) is None


def test_every_option_in_the_table_parses_and_every_option_is_in_it() -> None:
    rows = docs.table_rows(_section("Options"))
    documented = {}
    for cell in (r[0] for r in rows):
        match = re.fullmatch(r"`(--[a-z-]+) ([A-Z]+)`", cell)
        if match:
            documented[match.group(1)] = match.group(2)
    assert set(documented) == set(opts.KNOWN), documented
    values = {"NAME": "gpt-5-mini", "N": "20000"}
    for name, placeholder in documented.items():
        for words in (f"{name} {values[placeholder]} go", f"{name}={values[placeholder]} go"):
            parsed = opts.parse(words)
            assert parsed.problems == () and parsed.rest == "go", (words, parsed)


def test_the_options_example_reads_as_the_page_says() -> None:
    example = f"@{BOT} --model gpt-5-mini --max-tokens 20000 please fix the flaky test"
    assert f"`{example}`" in _page()
    mention = find_mention(example, BOT)
    assert mention is not None and mention.options is not None
    assert mention.options.options == opts.TaskOptions("gpt-5-mini", 20000)
    assert mention.instruction == "please fix the flaky test"


def test_the_options_rules_the_page_states() -> None:
    section = _section("Options")
    assert "at most 8" in section and "10¹²" in section
    assert opts.parse(" ".join(["--model m"] * 8) + " go").problems == ()
    assert opts.parse(" ".join(["--model m"] * 9) + " go").problems
    assert opts.parse("--max-tokens 1 go").problems == ()
    assert opts.parse(f"--max-tokens {10**12} go").problems == ()
    assert opts.parse(f"--max-tokens {10**12 + 1} go").problems
    assert opts.parse("--force go").problems  # an unknown option refuses the mention
    assert opts.parse("go --force").rest == "go --force"  # later, it is prose
    assert f"`{opts.cap_text(20000).replace('20000', 'N')}`" in section


def test_options_before_a_command_leave_the_command() -> None:
    mention = find_mention(f"@{BOT} --model m status", BOT)
    assert mention is not None and mention.command is Command.STATUS
