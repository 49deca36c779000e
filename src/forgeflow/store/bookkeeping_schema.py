"""The bookkeeping tables, on the store's one ``metadata``: each bot comment's intent and
result, each push of a session branch, the audit log, the operators' control and its
answered requests, domain events for pipeline triggers, worker nodes and repository
leases, sign-in sessions. Their records are ``domain/bookkeeping.py``'s.

Migrations in ``migrations/versions`` create exactly this; a test compares the two.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Column, Index, Integer, String, Table, Text

from forgeflow.store.metadata import metadata
from forgeflow.store.types import JSONText, UTCDateTime

comments = Table(
    "comments",
    metadata,
    Column("comment_key", String(120), primary_key=True),
    Column("task_id", String(64), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("resource_key", String(260), nullable=False),
    Column("turn_id", String(200)),
    Column("turn_key", String(80)),
    Column("comment_id", BigInteger),
    Column("body_hash", String(80)),
    Column("body", Text),
    Column("status", String(16), nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Index("ix_comments_task_id", "task_id"),
)

# One row per push of a session's branch: the intent before ``git push``, the result
# after; a retry after a crash asks Gitea for the branch before pushing again (0005).
pushes = Table(
    "pushes",
    metadata,
    Column("push_key", String(340), primary_key=True),  # <sessionKey>@<new sha>
    Column("task_id", String(64), nullable=False),
    Column("session_key", String(260), nullable=False),
    Column("target", String(255), nullable=False),
    Column("old_sha", String(64)),
    Column("new_sha", String(64), nullable=False),
    Column("status", String(16), nullable=False),  # pending, pushed, refused
    Column("error", Text),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Index("ix_pushes_task_id", "task_id"),
    Index("ix_pushes_session_key", "session_key"),
)

audit_events = Table(
    "audit_events",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("event_id", String(64), nullable=False, unique=True),
    Column("task_id", String(64)),
    Column("session_key", String(260)),
    Column("repo_key", String(220)),
    Column("actor", String(200), nullable=False),
    Column("action", String(64), nullable=False),
    Column("from_state", String(32)),
    Column("to_state", String(32)),
    Column("state_version", Integer),
    Column("delivery_id", String(200)),
    Column("turn_id", String(200)),
    Column("comment_id", BigInteger),
    Column("error_code", String(64)),
    Column("timestamp", UTCDateTime(), nullable=False),
    Column("metadata", JSONText),
    Index("ix_audit_task", "task_id", "seq"),
    Index("ix_audit_session", "session_key", "seq"),
    Index("ix_audit_repo", "repo_key", "seq"),
    Index("ix_audit_timestamp", "timestamp"),
)

control = Table(
    "control",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("global_paused", Boolean, nullable=False),
    Column("pause_reason", Text),
    Column("updated_by", String(200)),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("version", Integer, nullable=False),
)

control_requests = Table(
    "control_requests",
    metadata,
    Column("request_id", String(200), primary_key=True),
    Column("action", String(64), nullable=False),
    Column("target", String(260), nullable=False),
    Column("operator", String(200), nullable=False),
    Column("status_code", Integer, nullable=False),
    Column("response", JSONText, nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
)

# Domain events for pipeline triggers (PIPELINES "Sự kiện miền"): written in the same
# transaction as the change they describe, consumed by the trigger dispatcher.
domain_events = Table(
    "domain_events",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("event_type", String(64), nullable=False),
    Column("dedupe_key", String(300), nullable=False, unique=True),
    Column("repo_key", String(220)),
    Column("payload", JSONText, nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("dispatched_at", UTCDateTime()),
    Index("ix_domain_events_pending", "dispatched_at", "seq"),
)

# One row per worker node: who it is now and when it last said so (repository affinity
# is handed over when a worker stops beating).
workers = Table(
    "workers",
    metadata,
    Column("worker_id", String(200), primary_key=True),
    Column("owner", String(200), nullable=False),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", UTCDateTime(), nullable=False),
    Column("heartbeat_at", UTCDateTime(), nullable=False),
)

repo_leases = Table(
    "repo_leases",
    metadata,
    Column("repo_key", String(220), primary_key=True),
    Column("lease_id", String(64), nullable=False),
    Column("owner", String(200), nullable=False),
    Column("task_id", String(64)),
    Column("acquired_at", UTCDateTime(), nullable=False),
    Column("expires_at", UTCDateTime(), nullable=False),
)

# Sign-in sessions of the admin pages: the cookie names a row, so signing out (or an
# operator ending it) stops a copied cookie on every process.
ui_sessions = Table(
    "ui_sessions",
    metadata,
    Column("session_id", String(64), primary_key=True),
    Column("operator", String(100), nullable=False),
    Column("address", String(64)),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("expires_at", UTCDateTime(), nullable=False),
    Column("ended_at", UTCDateTime()),
    Column("ended_by", String(200)),
    Index("ix_ui_sessions_expires", "expires_at"),
)

# A sign-in session of a Gitea user (Sign in with Gitea): the user's tokens, sealed with
# a key derived from the admin token (web/sealing.py), never shown or logged.
ui_gitea_logins = Table(
    "ui_gitea_logins",
    metadata,
    Column("session_id", String(64), primary_key=True),
    Column("login", String(100), nullable=False),
    Column("operator", Boolean, nullable=False),
    Column("sealed_tokens", Text, nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
)
