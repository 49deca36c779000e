"""A turn's transcript: what the agent said and did, as a reviewer reads it.

Each finished item of a turn (``item/completed`` from the app-server) becomes one
:class:`Entry`: a message, a shell command with its exit code and output, a file change
with its diff, an MCP tool call with its arguments and result. Entries are bounded and
redacted here, before anything stores or shows them, so no caller can forget either.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# What one entry keeps. A command's output or a tool's result beyond this is cut in the
# middle: the start says what ran, the end says how it finished.
OUTPUT_LIMIT = 8_000
# A diff is what a reviewer reads most closely; it gets more room.
DIFF_LIMIT = 32_000
# Messages and plans are prose the agent wrote for people.
TEXT_LIMIT = 16_000
# Entries kept per turn; a runaway turn past this records one closing "left out" entry.
TURN_LIMIT = 500


class EntryKind(StrEnum):
    MESSAGE = "message"
    PLAN = "plan"
    COMMAND = "command"
    FILE_CHANGE = "file_change"
    TOOL_CALL = "tool_call"
    LEFT_OUT = "left_out"


@dataclass(frozen=True, slots=True)
class Entry:
    """One thing the agent did, ready to store and show: bounded and redacted."""

    kind: EntryKind
    title: str
    body: str
    status: str | None = None
    exit_code: int | None = None
    truncated: bool = False


def clip(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to about ``limit`` characters, keeping its start and its end."""
    if len(text) <= limit:
        return text, False
    head = limit * 2 // 3
    tail = limit - head
    left_out = len(text) - head - tail
    return f"{text[:head]}\n… [{left_out} characters left out] …\n{text[-tail:]}", True


def _json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, indent=2, sort_keys=True)


def _command(item: Mapping[str, Any]) -> tuple[str, str, int | None]:
    command = item.get("command")
    title = " ".join(map(str, command)) if isinstance(command, list) else str(command or "")
    code = item.get("exitCode")
    return title, str(item.get("aggregatedOutput") or ""), code if isinstance(code, int) else None


def _file_change(item: Mapping[str, Any]) -> tuple[str, str]:
    changes = [c for c in item.get("changes") or [] if isinstance(c, Mapping)]
    paths = ", ".join(str(c.get("path") or "?") for c in changes)
    parts = []
    for change in changes:
        # An added file's "diff" is its content; the kind line says which it is.
        kind = change.get("kind")
        how = kind.get("type") if isinstance(kind, Mapping) else kind
        parts.append(f"{how or 'change'} {change.get('path') or '?'}\n{change.get('diff') or ''}")
    return paths, "\n".join(parts)


def _tool_call(item: Mapping[str, Any]) -> tuple[str, str]:
    title = f"{item.get('server')}.{item.get('tool')}"
    parts = [f"arguments: {_json(item.get('arguments') or {})}"]
    error = item.get("error")
    if isinstance(error, Mapping) and error.get("message"):
        parts.append(f"error: {error.get('message')}")
    result = item.get("result")
    if isinstance(result, Mapping):
        texts = [
            str(p.get("text"))
            for p in result.get("content") or []
            if isinstance(p, Mapping) and p.get("text") is not None
        ]
        parts.append("result: " + ("\n".join(texts) if texts else _json(result)))
    return title, "\n".join(parts)


def from_item(item: Mapping[str, Any], redact: Callable[[Any], Any]) -> Entry | None:
    """The entry for one completed item, or ``None`` for items a reviewer has no use for
    (the user's own prompt, reasoning, context compaction, …).

    ``redact`` masks secrets in a JSON value; it runs on the whole item first, so that a
    secret is masked before clipping could cut it in half, and values under secret-named
    keys (a tool's ``token`` argument) are masked too."""
    item = redact(dict(item))
    kind = item.get("type")
    status = item.get("status")
    status = str(status) if status is not None else None
    code: int | None = None
    if kind in ("agentMessage", "plan"):
        entry_kind = EntryKind.MESSAGE if kind == "agentMessage" else EntryKind.PLAN
        title, body, limit = entry_kind.value, str(item.get("text") or ""), TEXT_LIMIT
    elif kind == "commandExecution":
        title, body, code = _command(item)
        entry_kind, limit = EntryKind.COMMAND, OUTPUT_LIMIT
    elif kind == "fileChange":
        title, body = _file_change(item)
        entry_kind, limit = EntryKind.FILE_CHANGE, DIFF_LIMIT
    elif kind == "mcpToolCall":
        title, body = _tool_call(item)
        entry_kind, limit = EntryKind.TOOL_CALL, OUTPUT_LIMIT
    else:
        return None
    body, truncated = clip(body, limit)
    title, title_cut = clip(title, 500)
    return Entry(entry_kind, title, body, status, code, truncated or title_cut)


LEFT_OUT = Entry(
    EntryKind.LEFT_OUT,
    "left out",
    f"The turn did more than {TURN_LIMIT} things; the rest is not kept.",
    truncated=True,
)
