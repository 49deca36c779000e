"""The typed records of the tables that keep the service's own bookkeeping: bot
comments, pushes, the audit trail, the pause switch and its idempotent requests, repository leases,
worker nodes, sign-in sessions and pipeline domain events.

As in ``domain/records.py``: one frozen record per table, each field named and typed
as its column (``store/schema.py``; a test holds the two together), built from rows in
one place (``store/rows.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

from forgeflow.domain.json import JsonObject
from forgeflow.domain.records import Record


@dataclass(frozen=True, slots=True)
class AuditEntry(Record):
    """One audit event as recorded (``store/audit.append`` writes it, redacted)."""

    seq: int
    event_id: str
    task_id: str | None
    session_key: str | None
    repo_key: str | None
    actor: str
    action: str
    from_state: str | None
    to_state: str | None
    state_version: int | None
    delivery_id: str | None
    turn_id: str | None
    comment_id: int | None
    error_code: str | None
    timestamp: datetime
    metadata: JsonObject  # the event's details; {} when it has none


@dataclass(frozen=True, slots=True)
class Comment(Record):
    """A bot comment: the intent written before it is posted, its result after."""

    JSON_OMIT: ClassVar[frozenset[str]] = frozenset({"body", "updated_at"})

    comment_key: str
    task_id: str
    kind: str
    resource_key: str
    turn_id: str | None
    turn_key: str | None
    comment_id: int | None  # Gitea's id, once posted (or found)
    body_hash: str | None
    body: str | None  # kept for an outbox that posts it later
    status: str  # pending, sent, confirmed, failed or skipped
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class Push(Record):
    """A push of a session's branch: the intent before ``git push``, the result after."""

    push_key: str  # <sessionKey>@<new sha>
    task_id: str
    session_key: str
    target: str
    old_sha: str | None
    new_sha: str
    status: str  # pending, pushed or refused
    error: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class Control(Record):
    """The one row of the global pause."""

    JSON_OMIT: ClassVar[frozenset[str]] = frozenset({"id"})

    id: int
    global_paused: bool
    pause_reason: str | None
    updated_by: str | None
    updated_at: datetime
    version: int


@dataclass(frozen=True, slots=True)
class ControlRequest(Record):
    """An operator's control request as answered once: a repeated ``requestId`` gets
    this answer again."""

    request_id: str
    action: str
    target: str
    operator: str
    status_code: int
    response: JsonObject  # the JSON answered
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Lease(Record):
    """A repository's lease: at most one holder, released only by its ``lease_id``."""

    repo_key: str
    lease_id: str
    owner: str
    task_id: str | None
    acquired_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class Worker(Record):
    """A worker node: its current incarnation and when it last said it is alive."""

    worker_id: str
    owner: str
    host: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime


@dataclass(frozen=True, slots=True)
class UiSession(Record):
    """A sign-in session of the admin pages (the signed cookie names it)."""

    session_id: str
    operator: str
    address: str | None
    created_at: datetime
    expires_at: datetime
    ended_at: datetime | None
    ended_by: str | None

    def live(self, now: datetime) -> bool:
        return self.ended_at is None and self.expires_at > now


@dataclass(frozen=True, slots=True)
class StoredEvent(Record):
    """A pipeline domain event as recorded, until the trigger dispatcher takes it."""

    seq: int
    event_type: str
    dedupe_key: str
    repo_key: str | None
    payload: JsonObject  # the event's JSON, as triggers match it
    created_at: datetime
    dispatched_at: datetime | None
