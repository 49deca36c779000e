"""A Codex thread's rollout as forgeflow keeps it for another worker (issue #27).

Codex writes each thread to a JSONL file under its ``CODEX_HOME/sessions/YYYY/MM/DD/``;
``thread/resume`` with that file's ``path`` brings the thread back on an app-server that
never had it. The file lives in the agent's home, so what forgeflow reads of it (out of
a one-shot jail's stdout, agent/rollout.py) is the agent's to forge: it is bounded here
(bytes, lines, one JSON object per line), redacted like a transcript, and its name is
checked against Codex's own pattern before it is ever used as a path inside a jail.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

# What one thread's rollout may weigh to be kept: past it the thread is not restored
# (the next prompt carries the conversation instead, tasks/rebuild.py).
BYTE_LIMIT = 8 * 1024 * 1024
LINE_LIMIT = 20_000
# Codex's file name: rollout-<local time>-<thread id>.jsonl below a dated folder.
_NAME = re.compile(
    r"\d{4}/\d{2}/\d{2}/rollout-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-(?P<id>[0-9a-f-]{36})\.jsonl"
)
_THREAD_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

# Why a rollout is not kept (the stored row says which; a restore then rebuilds).
ABSENT = "absent"  # no such file (or more than one) in the jail's home
TOO_BIG = "too_big"
CORRUPT = "corrupt"  # not JSON lines of objects, or a forged name
KEPT = "kept"


@dataclass(frozen=True, slots=True)
class Rollout:
    """A thread's rollout, redacted: ``name`` is its path below ``CODEX_HOME/sessions``."""

    thread_id: str
    name: str
    body: str  # JSONL, one object a line, ending with a newline
    lines: int

    @property
    def size(self) -> int:
        return len(self.body.encode())


@dataclass(frozen=True, slots=True)
class NotKept:
    """A rollout that could not be kept, and why (one of the reasons above)."""

    reason: str
    detail: str = ""


def valid_thread_id(thread_id: str) -> bool:
    return _THREAD_ID.fullmatch(thread_id) is not None


def check_name(name: str, thread_id: str) -> bool:
    """``name`` is Codex's own for ``thread_id`` (no ``..``, no absolute path)."""
    match = _NAME.fullmatch(name)
    return match is not None and match.group("id") == thread_id


def parse(
    thread_id: str, stdout: bytes, truncated: bool, redact: Callable[[str], str]
) -> Rollout | NotKept:
    """The export step's output (``ff:rollout <name>`` then the file, or ``ff:absent``)
    as a kept rollout, or why it is not kept. ``redact``: the secret masking of text."""
    if truncated:
        return NotKept(TOO_BIG, f"over {BYTE_LIMIT} bytes")
    head, _, data = stdout.partition(b"\n")
    words = head.decode("ascii", "replace").split()
    if words[:1] == ["ff:absent"]:
        return NotKept(ABSENT, "no rollout file of the thread in the agent's home")
    if words[:1] != ["ff:rollout"] or len(words) != 2:
        return NotKept(CORRUPT, "the export step's output is not its own")
    name = words[1]
    if not check_name(name, thread_id):
        return NotKept(CORRUPT, "the file's name is not Codex's")
    if len(data) > BYTE_LIMIT:
        return NotKept(TOO_BIG, f"over {BYTE_LIMIT} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return NotKept(CORRUPT, "not UTF-8")
    lines = text.splitlines()
    if len(lines) > LINE_LIMIT:
        return NotKept(TOO_BIG, f"over {LINE_LIMIT} lines")
    kept = [_line(line, redact) for line in lines if line.strip()]
    if not kept or any(line is None for line in kept):
        return NotKept(CORRUPT, "not one JSON object a line")
    body = "".join(f"{line}\n" for line in kept if line is not None)
    return Rollout(thread_id, name, body, len(kept))


def check(kept: Rollout) -> Rollout | NotKept:
    """A kept rollout read back from the database, checked again before a jail gets it
    (a row is only as good as what wrote it)."""
    if not check_name(kept.name, kept.thread_id):
        return NotKept(CORRUPT, "the file's name is not Codex's")
    if kept.size > BYTE_LIMIT or kept.lines > LINE_LIMIT:
        return NotKept(TOO_BIG, f"over {BYTE_LIMIT} bytes or {LINE_LIMIT} lines")
    if any(_line(line, str) is None for line in kept.body.splitlines()):
        return NotKept(CORRUPT, "not one JSON object a line")
    return kept


def _line(line: str, redact: Callable[[str], str]) -> str | None:
    """One line, redacted, if it is (and stays) a JSON object with a string ``type``."""
    redacted = redact(line)
    try:
        value = json.loads(redacted)
    except (ValueError, RecursionError):  # nesting past the decoder's depth: corrupt too
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        return None
    return redacted
