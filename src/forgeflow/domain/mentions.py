"""Mention parsing and instruction extraction.

A mention counts only as a standalone ``@<bot>`` token in prose: not inside a word or
an e-mail address, not in inline code, not in a fenced code block and not on a quoted
reply line. Hand-written because Markdown parsers drop the source offsets we need to
cut the instruction out of the original text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from forgeflow.domain import options as opts

_FENCE_RE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})")
_QUOTE_RE = re.compile(r"^ {0,3}>")
_INLINE_CODE_RE = re.compile(r"(?P<ticks>`+)(?:(?!(?P=ticks)).)+?(?P=ticks)", re.DOTALL)
# Gitea logins may hold letters, digits, '-', '_' and '.'; a following character from
# that set (or a dot followed by one) means the token names a different account.
_LOGIN_CHAR = r"[A-Za-z0-9_\-]"


class Command(StrEnum):
    """Comment commands that are handled by forgeflow and never reach the agent."""

    STOP = "stop"
    STATUS = "status"
    NEW_SESSION = "new session"


# ``@bot review [focus...]``: a pull request review, the rest of the line its focus.
REVIEW_WORD = "review"


@dataclass(frozen=True, slots=True)
class Mention:
    instruction: str
    command: Command | None = None
    # Set when the instruction asks for a review: the reviewer's focus ("" for none).
    review_focus: str | None = None
    # The leading ``--model``/``--max-tokens`` options (domain/options.py); the
    # instruction above is what follows them.
    options: opts.Parsed | None = None


def _mask(text: str) -> str:
    """Blank out fenced blocks, quoted lines and inline code, keeping offsets."""
    out: list[str] = []
    fence: str | None = None
    for line in text.splitlines(keepends=True):
        m = _FENCE_RE.match(line)
        if fence is not None:
            if m and m["fence"][0] == fence[0] and len(m["fence"]) >= len(fence):
                fence = None
            out.append(_blank(line))
            continue
        if m:
            fence = m["fence"]
            out.append(_blank(line))
            continue
        if _QUOTE_RE.match(line):
            out.append(_blank(line))
            continue
        out.append(line)
    masked = "".join(out)
    return _INLINE_CODE_RE.sub(lambda m: _blank(m.group(0)), masked)


def _blank(s: str) -> str:
    return "".join(c if c == "\n" else " " for c in s)


def _mention_re(bot_login: str) -> re.Pattern[str]:
    return re.compile(
        rf"(?<![A-Za-z0-9_.@\-/])@{re.escape(bot_login)}"
        rf"(?!{_LOGIN_CHAR})(?!\.{_LOGIN_CHAR})",
        re.IGNORECASE,
    )


def find_mention(text: str, bot_login: str) -> Mention | None:
    """Return the first valid mention of ``bot_login`` in ``text`` with its instruction."""
    if not text or not bot_login:
        return None
    match = _mention_re(bot_login).search(_mask(text))
    if match is None:
        return None
    instruction = text[match.end() :].strip()
    instruction = instruction.lstrip(",:;.!?)").strip()
    parsed = opts.parse(instruction)
    instruction = parsed.rest
    return Mention(
        instruction=instruction,
        command=_command(instruction),
        review_focus=review_focus(instruction),
        options=parsed if parsed.problems or not parsed.options.empty else None,
    )


def _command(instruction: str) -> Command | None:
    words = " ".join(instruction.split()).lower().rstrip(".!")
    for command in Command:
        if words == command.value:
            return command
    return None


def review_focus(instruction: str) -> str | None:
    """The focus of a ``review`` instruction (its first word, any case, then free text),
    or None when the instruction is not a review request. ``review:`` and ``review,``
    count; ``reviewed`` or ``reviews`` do not."""
    m = re.match(r"review(?![A-Za-z0-9_\-])[\s,:;.!?]*", instruction, re.IGNORECASE)
    if m is None:
        return None
    return instruction[m.end() :].strip()
