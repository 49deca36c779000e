"""Per-mention options (``@bot --model NAME --max-tokens N …``): parsed, checked, shown.

Options are the ``--`` words at the very start of the instruction, the way a command is
the instruction: ``@bot --model gpt-5 --max-tokens 20000 fix the test``. The first word
that does not start with ``--`` ends them, so ``--force`` later in the text is prose.
A problem (an unknown option, a missing or malformed value, a model the operator does
not allow, a cap above the repository's budget) refuses the mention with one comment
naming it and the allowed values; the rules here are pure, the store counts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from forgeflow.domain.budgets import Period

MODEL = "--model"
MAX_TOKENS = "--max-tokens"
KNOWN = (MODEL, MAX_TOKENS)
# Bounds on what a comment can make us keep: a model name as Codex names models, a
# cap that fits a BIGINT with room, and at most a few option words.
_MODEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/\-]{0,99}")
MAX_CAP = 10**12
_MAX_WORDS = 8
_SHOWN = 60  # an offending word is quoted at most this long
_WORD_RE = re.compile(r"\S+")


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """What a mention asked for: a model and a token cap (None: the defaults)."""

    model: str | None = None
    max_tokens: int | None = None

    @property
    def empty(self) -> bool:
        return self.model is None and self.max_tokens is None


@dataclass(frozen=True, slots=True)
class Parsed:
    """The options of an instruction, what was wrong with them, and the instruction
    without them (what the agent is asked)."""

    options: TaskOptions
    problems: tuple[str, ...]
    rest: str


def _quoted(word: str) -> str:
    word = word if len(word) <= _SHOWN else word[: _SHOWN - 1] + "…"
    return "`" + word.replace("`", "'") + "`"


def _take_value(inline: str | None, words: list[re.Match[str]]) -> str | None:
    """The value of ``--name=value`` or ``--name value`` (None when it is missing)."""
    if inline is not None:
        return inline or None
    if words and not words[0].group().startswith("--"):
        return words.pop(0).group()
    return None


def parse(instruction: str) -> Parsed:
    """Split the leading options off ``instruction``."""
    words: list[re.Match[str]] = []
    for found in _WORD_RE.finditer(instruction):
        words.append(found)
        if len(words) > 2 * _MAX_WORDS + 1:
            break
    problems: list[str] = []
    model: str | None = None
    cap: int | None = None
    used = 0
    cut = 0  # where the instruction after the options starts
    while words and words[0].group().startswith("--") and used < _MAX_WORDS:
        used += 1
        name, eq, inline = words.pop(0).group().partition("=")
        value = _take_value(inline if eq else None, words)
        if name not in KNOWN:
            problems.append(f"unknown option {_quoted(name)}")
        elif value is None:
            problems.append(f"{name} needs a value")
        elif name == MODEL:
            if _MODEL_RE.fullmatch(value) is None:
                problems.append(f"{MODEL} {_quoted(value)} is not a model name")
            else:
                model = value
        elif not value.isdigit() or not 0 < int(value) <= MAX_CAP:
            problems.append(f"{MAX_TOKENS} {_quoted(value)} is not a number of tokens")
        else:
            cap = int(value)
    if words and words[0].group().startswith("--"):
        problems.append(f"more than {_MAX_WORDS} options")
    if used:
        cut = words[0].start() if words else len(instruction)
    rest = instruction[cut:].strip()
    return Parsed(TaskOptions(model, cap), tuple(problems), rest)


def refusal(
    parsed: Parsed,
    allowed_models: Sequence[str],
    limits: Mapping[Period, int | None],
) -> str | None:
    """Why the options refuse the mention, naming each problem and the allowed values;
    None when they are fine. ``limits``: the repository's token budgets by period."""
    problems = list(parsed.problems)
    model = parsed.options.model
    if model is not None and model not in allowed_models:
        problems.append(f"{MODEL} {_quoted(model)} is not allowed")
    ceiling = cap_ceiling(limits)
    cap = parsed.options.max_tokens
    if cap is not None and ceiling is not None and cap > ceiling:
        problems.append(f"{MAX_TOKENS} {cap} is over the repository's token budget")
    if not problems:
        return None
    return "; ".join(problems) + ". " + allowed_text(allowed_models, ceiling)


def cap_ceiling(limits: Mapping[Period, int | None]) -> int | None:
    """The largest cap a task may ask for: the repository's smallest budget."""
    set_ = [n for n in limits.values() if n is not None]
    return min(set_) if set_ else None


def allowed_text(allowed_models: Sequence[str], ceiling: int | None) -> str:
    models = ", ".join(_quoted(m) for m in allowed_models) if allowed_models else "none"
    up_to = ceiling if ceiling is not None else MAX_CAP
    return (
        f"Options: `{MODEL} NAME` with NAME one of {models}; "
        f"`{MAX_TOKENS} N` with N from 1 to {up_to}"
    )


def receipt_line(model: str | None, max_tokens: int | None) -> str | None:
    """The receipt's line about the task's options (None when it has none)."""
    parts = []
    if model is not None:
        parts.append(f"模型 / model: `{model}`")
    if max_tokens is not None:
        parts.append(f"上限 / cap: {max_tokens} tokens")
    return " · ".join(parts) if parts else None


def cap_reached(max_tokens: int | None, used: int) -> bool:
    return max_tokens is not None and used >= max_tokens


def cap_text(max_tokens: int) -> str:
    """The task's error when its cap stopped it (like a budget's, naming it)."""
    return f"over the token cap of {max_tokens} tokens for this task ({MAX_TOKENS})"
