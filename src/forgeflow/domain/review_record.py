"""A review task's review as forgeflow records it (pure, no I/O).

The intent of a review is a ``comments`` row of kind ``review`` whose body is the JSON
of :class:`ReviewRecord`: the fields of Gitea's ``CreatePullReviewOptions`` that are
posted (``body``, ``commit_id``, ``event``, ``comments[]`` of ``path``, ``body``,
``new_position``, ``old_position``) and, kept for forgeflow's own readers only, the
agent's ``summary`` and the line comments ``moved`` into the summary (``path``,
``side``, ``line``, ``body``). Records written before ``summary`` and ``moved`` existed
read with ``summary`` None and no ``moved``.

It is parsed here and only here (:meth:`ReviewRecord.parse`): the re-review's prompt,
the retry that posts a stored request and the pages all read it through this. The text
is the agent's, so it is parsed with bounds, and a reader that shows it to a model
fences it as untrusted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from forgeflow.domain.json import JsonObject, JsonValue
from forgeflow.domain.markers import parse_marker

Side = Literal["new", "old"]

MAX_RECORD_CHARS = 16 * 1024 * 1024  # 100 comments of 64 KiB, twice over, and the body
MAX_LINES = 1000  # the tool allows 100; a record with more is not one of ours


class ReviewRecordError(ValueError):
    """A stored review record that is not in the shape forgeflow writes."""


@dataclass(frozen=True, slots=True)
class PostedLine:
    """One line comment: where it is and its text as posted (a suggestion rendered)."""

    path: str
    side: Side
    line: int
    body: str

    @property
    def location(self) -> str:
        return f"{self.path}:{self.line} ({self.side})"

    def gitea(self) -> JsonObject:
        """As ``CreatePullReviewComment``: the line on its side, the other 0."""
        return {
            "path": self.path,
            "body": self.body,
            "new_position": self.line if self.side == "new" else 0,
            "old_position": self.line if self.side == "old" else 0,
        }

    def json(self) -> JsonObject:
        return {"path": self.path, "side": self.side, "line": self.line, "body": self.body}


@dataclass(frozen=True, slots=True)
class ReviewRecord:
    body: str  # the review's body as posted: summary, moved comments, the marker
    commit_id: str  # the head reviewed
    event: str
    comments: tuple[PostedLine, ...] = ()  # on their lines of the diff
    summary: str | None = None  # the agent's summary alone (None: an older record)
    moved: tuple[PostedLine, ...] = ()  # moved into the summary: not on the diff

    @property
    def shown_summary(self) -> str:
        """The summary to show: the agent's, or (an older record) the body as posted
        without its marker line."""
        if self.summary is not None:
            return self.summary
        lines = self.body.rstrip("\n").split("\n")
        if lines and parse_marker(lines[-1]) is not None:
            lines = lines[:-1]
        return "\n".join(lines).strip()

    def json(self) -> JsonObject:
        return {
            "event": self.event,
            "body": self.body,
            "commit_id": self.commit_id,
            "comments": [c.gitea() for c in self.comments],
            "summary": self.summary,
            "moved": [c.json() for c in self.moved],
        }

    def dumps(self) -> str:
        return json.dumps(self.json(), ensure_ascii=False)

    @classmethod
    def parse(cls, text: str) -> ReviewRecord:
        """The record :meth:`dumps` wrote; :class:`ReviewRecordError` names what is
        wrong otherwise."""
        if len(text) > MAX_RECORD_CHARS:
            raise ReviewRecordError(f"review record longer than {MAX_RECORD_CHARS} characters")
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ReviewRecordError(f"review record is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ReviewRecordError("review record is not a JSON object")
        summary = data.get("summary")
        if summary is not None and not isinstance(summary, str):
            raise ReviewRecordError("review record's summary is not text")
        return cls(
            body=_str(data, "body"),
            commit_id=_str(data, "commit_id"),
            event=_str(data, "event"),
            comments=tuple(_gitea_line(c) for c in _list(data, "comments")),
            summary=summary,
            moved=tuple(_moved_line(c) for c in _list(data, "moved", required=False)),
        )


@dataclass(frozen=True, slots=True)
class BotReview:
    """A review task's review as the store has it: its intent and result, and the
    record (None when its body could not be read, ``error`` says why)."""

    task_id: str
    resource_key: str
    status: str  # pending, sent (the comments table's statuses)
    review_id: int | None  # Gitea's id, once posted or found
    created_at: datetime  # the intent
    updated_at: datetime  # the result
    record: ReviewRecord | None
    error: str | None = None

    @property
    def posted(self) -> bool:
        return self.status == "sent" and self.review_id is not None


def _str(data: dict[str, JsonValue], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise ReviewRecordError(f"review record's {key} is not text")
    return value


def _list(data: dict[str, JsonValue], key: str, *, required: bool = True) -> list[JsonValue]:
    value = data.get(key)
    if value is None and not required:
        return []
    if not isinstance(value, list):
        raise ReviewRecordError(f"review record's {key} is not a list")
    if len(value) > MAX_LINES:
        raise ReviewRecordError(f"review record's {key} has more than {MAX_LINES} entries")
    return value


def _int(c: dict[str, JsonValue], key: str, what: str) -> int:
    value = c.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ReviewRecordError(f"{what} {key} is not a line number")
    return value


def _object(value: JsonValue, what: str) -> dict[str, JsonValue]:
    if not isinstance(value, dict):
        raise ReviewRecordError(f"{what} is not a JSON object")
    return value


def _gitea_line(value: JsonValue) -> PostedLine:
    c = _object(value, "a review record's line comment")
    new, old = _int(c, "new_position", "line comment"), _int(c, "old_position", "line comment")
    if (new == 0) == (old == 0):
        raise ReviewRecordError("line comment has not exactly one of new_position, old_position")
    side: Side = "new" if new else "old"
    return PostedLine(_str(c, "path"), side, new or old, _str(c, "body"))


def _moved_line(value: JsonValue) -> PostedLine:
    c = _object(value, "a review record's moved comment")
    if c.get("side") not in ("new", "old"):
        raise ReviewRecordError("moved comment's side is not new or old")
    side: Side = "new" if c.get("side") == "new" else "old"
    return PostedLine(_str(c, "path"), side, _int(c, "line", "moved comment"), _str(c, "body"))
