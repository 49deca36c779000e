"""Per-mention options (#25 item 4): parsed off the instruction, checked, shown."""

from __future__ import annotations

from forgeflow.domain import options
from forgeflow.domain.budgets import Period
from forgeflow.domain.mentions import Command, find_mention


def test_leading_options_are_parsed_and_cut_off() -> None:
    parsed = options.parse("--model gpt-5-mini --max-tokens=20000 fix the flaky test\nplease")
    assert parsed.options == options.TaskOptions("gpt-5-mini", 20000)
    assert parsed.problems == ()
    assert parsed.rest == "fix the flaky test\nplease"


def test_options_end_at_the_first_word_that_is_not_one() -> None:
    parsed = options.parse("--model m run git push --force please")
    assert parsed.options.model == "m"
    assert parsed.rest == "run git push --force please"
    # A value that repeats a later word does not cut the instruction in the wrong place.
    assert options.parse("--model fixer fix it").rest == "fix it"


def test_no_options_leave_the_instruction_as_it_is() -> None:
    parsed = options.parse("  fix   the test ")
    assert parsed.options.empty and parsed.problems == () and parsed.rest == "fix   the test"


def test_problems_name_the_option() -> None:
    parsed = options.parse("--frobnicate --model --max-tokens lots do it")
    assert parsed.problems == (
        "unknown option `--frobnicate`",
        "--model needs a value",
        "--max-tokens `lots` is not a number of tokens",
    )
    assert parsed.rest == "do it"
    assert options.parse("--max-tokens 0 x").problems == (
        "--max-tokens `0` is not a number of tokens",
    )
    assert options.parse("--model a;b x").problems == ("--model `a;b` is not a model name",)


def test_too_many_options_are_a_problem() -> None:
    parsed = options.parse(" ".join(["--model m"] * 9) + " go")
    assert "more than 8 options" in parsed.problems


def test_refusal_names_what_is_wrong_and_what_is_allowed() -> None:
    limits: dict[Period, int | None] = {"day": 5000, "month": None}
    parsed = options.parse("--model big --max-tokens 9000 go")
    why = options.refusal(parsed, ("small", "medium"), limits)
    assert why is not None
    assert "--model `big` is not allowed" in why
    assert "--max-tokens 9000 is over the repository's token budget" in why
    assert "one of `small`, `medium`" in why and "from 1 to 5000" in why


def test_allowed_options_pass() -> None:
    parsed = options.parse("--model small --max-tokens 4000 go")
    assert options.refusal(parsed, ("small",), {"day": 5000, "month": None}) is None
    # Without budgets, any cap up to the bound.
    assert options.refusal(parsed, ("small",), {"day": None, "month": None}) is None


def test_receipt_line_and_cap() -> None:
    assert options.receipt_line(None, None) is None
    assert options.receipt_line("m", 100) == "模型 / model: `m` · 上限 / cap: 100 tokens"
    assert options.cap_reached(100, 100) and not options.cap_reached(100, 99)
    assert not options.cap_reached(None, 10**9)
    assert "token cap of 100 tokens" in options.cap_text(100)


def test_a_mention_carries_its_options_and_the_rest_is_its_instruction() -> None:
    mention = find_mention("@ccweb-bot --model m --max-tokens 10 fix it", "ccweb-bot")
    assert mention is not None
    assert mention.instruction == "fix it"
    assert mention.options is not None and mention.options.options.model == "m"
    plain = find_mention("@ccweb-bot fix it", "ccweb-bot")
    assert plain is not None and plain.options is None
    # A command after options is still the command.
    command = find_mention("@ccweb-bot --model m status", "ccweb-bot")
    assert command is not None and command.command is Command.STATUS
    review = find_mention("@ccweb-bot --max-tokens 10 review security", "ccweb-bot")
    assert review is not None and review.review_focus == "security"
