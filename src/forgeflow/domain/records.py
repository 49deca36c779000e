"""The typed records of the rows the service works with: one shape per table.

Each field is named and typed as its column (``store/schema.py``); the store builds
them from rows in one place (``store/rows.py``), and the API's JSON and its schema
(``api/schemas.py``) are derived from them, so a task's shape is written down once.
Records are frozen: a change goes through the store and comes back as a new record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar

from forgeflow.domain.ids import ResourceRef, parse_resource_key
from forgeflow.domain.json import JsonObject
from forgeflow.domain.states import TaskState


def iso(value: datetime | None) -> str | None:
    """ISO-8601 UTC with a trailing Z: how every time leaves the service."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def camel(name: str) -> str:
    """``state_version`` → ``stateVersion``: the API's spelling of a column."""
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


class Record:
    """What the JSON of every record shares; the fields are the subclass's."""

    __slots__ = ()
    # Columns the API does not show (internal bookkeeping).
    JSON_OMIT: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def shown(cls) -> list[str]:
        """The fields the API shows, in their order."""
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        return [f.name for f in fields if f.name not in cls.JSON_OMIT]

    def json(self) -> JsonObject:
        """The record as the API answers it: camelCase keys, times as ISO strings."""
        out: JsonObject = {}
        for name in self.shown():
            value = getattr(self, name)
            if isinstance(value, datetime):
                value = iso(value)
            elif isinstance(value, Refs):
                value = value.json()
            out[camel(name)] = value
        return out


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class Refs:
    """A pull request's branches as its task knows them (the ``tasks.refs`` column):
    from the webhook's payload when the task is accepted (gitea/webhook.py), from Gitea
    again when it is prepared (tasks/prepare.py, with whether the base moved since the
    session's branch was made)."""

    base: str | None
    head: str | None
    head_sha: str | None
    head_repo: str | None  # owner/name of the head's repository (a fork's differs)
    upstream_moved: bool | None = None  # None until a preparation compared them

    @classmethod
    def of_json(cls, value: Mapping[str, Any]) -> Refs:
        """The stored (and answered) JSON back as the record."""
        moved = value.get("upstreamMoved")
        return cls(
            base=_text(value.get("base")),
            head=_text(value.get("head")),
            head_sha=_text(value.get("headSha")),
            head_repo=_text(value.get("headRepo")),
            upstream_moved=moved if isinstance(moved, bool) else None,
        )

    def json(self) -> dict[str, str | bool | None]:
        """As stored and answered; ``upstreamMoved`` only once a preparation knows it."""
        out: dict[str, str | bool | None] = {
            "base": self.base,
            "head": self.head,
            "headSha": self.head_sha,
            "headRepo": self.head_repo,
        }
        if self.upstream_moved is not None:
            out["upstreamMoved"] = self.upstream_moved
        return out


@dataclass(frozen=True, slots=True)
class Task(Record):
    """One piece of agent work: a mention's instruction or a pipeline step's prompt."""

    task_id: str
    delivery_key: str | None  # None for a pipeline's task (no webhook behind it)
    repo_key: str
    resource_key: str
    session_key: str
    comment_id: int | None
    author: str
    instruction: str
    state: TaskState
    attempt: int
    reply_attempt: int
    thread_id: str | None
    turn_id: str | None
    lease_id: str | None
    next_retry_at: datetime | None
    error_code: str | None
    execution_error: str | None
    reply_error: str | None
    refs: Refs | None  # a pull request's; None for an issue's task
    retry_step: str | None
    claimed_by: str | None
    turn_count: int
    input_tokens: int
    output_tokens: int
    created_at: datetime
    updated_at: datetime
    state_version: int
    mode: str | None  # a pipeline task's conversation mode; None for a mention
    model: str | None = None  # the mention's ``--model`` (None: the configured one)
    max_tokens: int | None = None  # the mention's ``--max-tokens`` cap (None: none)
    cached_input_tokens: int = 0  # the part of input_tokens the provider had cached

    @property
    def resource(self) -> ResourceRef:
        """The issue or pull request the task is about."""
        return parse_resource_key(self.resource_key)


@dataclass(frozen=True, slots=True)
class Repository(Record):
    """A Gitea repository the bot works in, registered on its first mention."""

    JSON_OMIT: ClassVar[frozenset[str]] = frozenset(
        {"daily_token_budget", "monthly_token_budget", "updated_at"}
    )

    repo_key: str
    instance_id: str
    owner: str
    name: str
    clone_url: str
    workspace_path: str
    default_branch: str
    status: str  # active or disabled
    worker_id: str | None  # the worker node the repository is bound to
    daily_token_budget: int | None  # None: the configured default
    monthly_token_budget: int | None
    registered_at: datetime
    last_fetch_at: datetime | None
    updated_at: datetime
    version: int


@dataclass(frozen=True, slots=True)
class Session(Record):
    """The conversation of one issue or pull request (or a pipeline's space on it)."""

    session_key: str
    resource_key: str
    repo_key: str
    kind: str
    number: int
    thread_id: str | None  # the agent's thread; None until the first turn
    runtime: JsonObject
    mcp: JsonObject
    status: str  # active or closed
    last_task_id: str | None
    last_turn_id: str | None
    created_at: datetime
    updated_at: datetime
    version: int
    mode: str | None  # None: the resource's own session; plan/review: a draft space


@dataclass(frozen=True, slots=True)
class Turn(Record):
    """One turn of the agent in a task: written before it starts, finished after."""

    turn_key: str
    turn_id: str | None  # the agent's id, known once the turn started
    task_id: str
    thread_id: str | None
    kind: str
    status: str
    event_seq: int
    last_message: str | None  # the agent's final message (a draft task's result)
    input_tokens: int
    output_tokens: int
    started_at: datetime | None
    completed_at: datetime | None
    cached_input_tokens: int = 0  # the part of input_tokens the provider had cached


@dataclass(frozen=True, slots=True)
class Delivery(Record):
    """A webhook delivery as recorded: what came in and what it was answered."""

    delivery_key: str
    delivery_id: str
    event_type: str
    received_at: datetime
    signature_valid: bool
    normalized: bool
    task_id: str | None
    status: str  # accepted, ignored, duplicate or rejected
    reason: str | None
    repo_key: str | None
    comment_id: int | None
    payload_hash: str
    response_code: int
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class TranscriptEntry(Record):
    """One finished item of a turn as kept for the task page (``domain/transcript.py``
    bounds and redacts it before it is stored)."""

    JSON_OMIT: ClassVar[frozenset[str]] = frozenset({"item_id"})

    seq: int
    task_id: str
    turn_id: str
    item_id: str
    kind: str  # an ``EntryKind`` value
    title: str
    body: str
    status: str | None
    exit_code: int | None
    truncated: bool
    created_at: datetime
