"""Pull request reviews: the diff's hunks, where a line comment may sit, the review's
text, and the bounded diff a review prompt inlines (pure, no I/O).

The agent names a line by its file, its side (``new`` or ``old``) and its number; Gitea
takes it as ``new_position`` / ``old_position`` of ``CreatePullReviewComment``. A line is
commentable when the pull request's diff at the reviewed commit shows it (an added,
removed or context line of a hunk). Any other comment is moved into the review's
summary with its location, so nothing the agent said is lost and the review never
fails on one bad line number.

The diff is untrusted text (the pull request's author wrote it): it is parsed with
bounds on its size, its files and its hunks.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Literal

from forgeflow.domain.markers import Marker, append_marker, quoted

Side = Literal["new", "old"]
EVENTS = ("COMMENT", "APPROVE", "REQUEST_CHANGES")

MAX_DIFF_BYTES = 8 * 1024 * 1024  # beyond this the diff is read no further
MAX_FILES = 3000
MAX_HUNKS_PER_FILE = 5000

# Skipped from the prompt's inlined diff by default (the agent may still read them).
DEFAULT_SKIP = (
    "*.lock",
    "package-lock.json",
    "yarn.lock",
    "pnpm-lock.yaml",
    "Cargo.lock",
    "poetry.lock",
    "uv.lock",
    "go.sum",
    "vendor/*",
    "*/vendor/*",
    "third_party/*",
    "node_modules/*",
    "*.min.js",
    "*.min.css",
    "*.pb.go",
    "*_pb2.py",
    "*.generated.*",
    "dist/*",
)

_HUNK_RE = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_GIT_HEADER = re.compile(rb"^diff --git a/(.*) b/(.*)$")


@dataclass(frozen=True, slots=True)
class LineComment:
    path: str
    side: Side
    line: int
    body: str
    suggestion: str | None = None

    @property
    def location(self) -> str:
        return f"{self.path}:{self.line} ({self.side})"


@dataclass(frozen=True, slots=True)
class ReviewDraft:
    """What the agent submitted through its review tool."""

    summary: str
    comments: tuple[LineComment, ...] = ()
    event: str = "COMMENT"


@dataclass(slots=True)
class FileDiff:
    path: str  # the new path ("" parts trimmed); a deleted file keeps its old path
    old_path: str
    text: bytes = b""
    new_lines: set[int] = field(default_factory=set)
    old_lines: set[int] = field(default_factory=set)
    binary: bool = False


@dataclass(frozen=True, slots=True)
class Placed:
    """A draft's line comments split into those Gitea gets on their line and those that
    move into the summary (their line is not in the diff)."""

    inline: tuple[LineComment, ...]
    moved: tuple[LineComment, ...]


def _unquote(path: bytes) -> str:
    text = path.decode("utf-8", errors="replace")
    return text[1:-1] if text.startswith('"') and text.endswith('"') else text


def parse_diff(diff: bytes) -> dict[str, FileDiff]:
    """The files of a unified ``git diff`` with the lines each hunk shows, by path.
    Reads at most :data:`MAX_DIFF_BYTES`, :data:`MAX_FILES` files and
    :data:`MAX_HUNKS_PER_FILE` hunks a file; what lies beyond is not commentable."""
    files: dict[str, FileDiff] = {}
    # Each file's lines, joined once at the end: ``bytes +=`` copies the whole text
    # each time, quadratic in a file's diff (an 8 MiB one held the event loop a minute).
    texts: dict[str, list[bytes]] = {}
    current: FileDiff | None = None
    old = new = 0
    hunks = 0
    for raw in diff[:MAX_DIFF_BYTES].splitlines(keepends=True):
        line = raw.rstrip(b"\r\n")
        header = _GIT_HEADER.match(line)
        if header is not None:
            if len(files) >= MAX_FILES:
                break
            current = FileDiff(_unquote(header[2]), _unquote(header[1]))
            files[current.path] = current
            texts[current.path] = [raw]
            old = new = hunks = 0
            continue
        if current is None:
            continue
        texts[current.path].append(raw)
        hunk = _HUNK_RE.match(line)
        if hunk is not None:
            hunks += 1
            old, new = int(hunk[1]), int(hunk[3])
            if hunks > MAX_HUNKS_PER_FILE:
                old = new = 0
            continue
        if line.startswith(b"Binary files "):
            current.binary = True
        if old == 0 and new == 0:
            continue  # file headers (---/+++, index, mode) or past the hunk bound
        if line.startswith(b"+") and not line.startswith(b"+++ "):
            current.new_lines.add(new)
            new += 1
        elif line.startswith(b"-") and not line.startswith(b"--- "):
            current.old_lines.add(old)
            old += 1
        elif line.startswith(b" ") or line == b"":
            current.new_lines.add(new)
            current.old_lines.add(old)
            new += 1
            old += 1
    for path, f in files.items():
        f.text = b"".join(texts[path])
    return files


def place(draft: ReviewDraft, files: dict[str, FileDiff]) -> Placed:
    inline: list[LineComment] = []
    moved: list[LineComment] = []
    for c in draft.comments:
        f = files.get(c.path)
        lines = (f.new_lines if c.side == "new" else f.old_lines) if f is not None else set()
        (inline if c.line in lines else moved).append(c)
    return Placed(tuple(inline), tuple(moved))


def _fence(text: str) -> str:
    """A backtick fence longer than any run of backticks in ``text``."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def comment_body(c: LineComment, *, suggestions: bool = True) -> str:
    """A line comment's text; a suggested replacement in Gitea's ``suggestion`` block,
    or, where Gitea does not read one (``suggestions`` false: gitea_versions.py), in a
    plain code block under "Suggested replacement:". The bot posts it: any marker in it
    is broken (``markers.quoted``), so it never reads as a task's answer."""
    if c.suggestion is None:
        return quoted(c.body)
    fence = _fence(c.suggestion)
    text = c.suggestion.rstrip(chr(10))
    if not suggestions:
        return quoted(f"{c.body}\n\nSuggested replacement:\n\n{fence}\n{text}\n{fence}")
    return quoted(f"{c.body}\n\n{fence}suggestion\n{text}\n{fence}")


def review_body(
    summary: str, moved: tuple[LineComment, ...], marker: Marker, *, suggestions: bool = True
) -> str:
    """The review's body: the summary, then the comments whose line is not in the diff
    (each with its location), then the hidden marker on the last line. Every marker in
    the agent's text above it is broken (``markers.quoted``)."""
    parts = [summary.strip() or "Review."]
    if moved:
        lines = ["**Comments on lines outside this pull request's diff:**", ""]
        for c in moved:
            text = comment_body(c, suggestions=suggestions).replace("\n", "\n  ")
            lines.append(f"- `{c.location}`: {text}")
        parts.append("\n".join(lines))
    return append_marker(quoted("\n\n".join(parts)), marker)


def review_event(asked: str, allowed: frozenset[str]) -> str:
    """The event Gitea gets: what the agent asked for when the repository's
    configuration allows the bot to, else ``COMMENT``."""
    return asked if asked in allowed and asked in EVENTS else "COMMENT"


@dataclass(frozen=True, slots=True)
class PromptDiff:
    text: str  # the diff inlined into the prompt
    listed: tuple[tuple[str, int], ...]  # files not inlined: path, diff size in bytes
    skipped: tuple[tuple[str, int], ...]  # lock, vendored, generated files


def skipped(path: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(path, p) for p in patterns)


def bound_diff(
    files: dict[str, FileDiff], *, max_bytes: int, skip: tuple[str, ...] = DEFAULT_SKIP
) -> PromptDiff:
    """The diff a review prompt inlines, at most ``max_bytes``: whole files in the diff's
    order while they fit; the others listed with their sizes; files matching ``skip``
    left out and named."""
    parts: list[str] = []
    listed: list[tuple[str, int]] = []
    skips: list[tuple[str, int]] = []
    used = 0
    for f in files.values():
        size = len(f.text)
        if skipped(f.path, skip):
            skips.append((f.path, size))
        elif used + size <= max_bytes:
            parts.append(f.text.decode("utf-8", errors="replace"))
            used += size
        else:
            listed.append((f.path, size))
    return PromptDiff("".join(parts), tuple(listed), tuple(skips))


def prompt_section(d: PromptDiff) -> str:
    """The review prompt's diff section."""
    fence = _fence(d.text)
    out = [f"{fence}diff", d.text.rstrip("\n"), fence] if d.text else ["(no diff inlined)"]
    if d.listed:
        out += ["", "Not inlined (too large for the prompt; read them with get_pull_diff):"]
        out += [f"- {p} ({n} bytes of diff)" for p, n in d.listed]
    if d.skipped:
        out += ["", "Skipped (lock, vendored or generated files):"]
        out += [f"- {p} ({n} bytes of diff)" for p, n in d.skipped]
    return "\n".join(out)
