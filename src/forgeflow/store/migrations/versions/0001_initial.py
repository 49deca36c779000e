"""Initial tables of ARCHITECTURE §4.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from forgeflow.store.types import JSONText, UTCDateTime

revision = "0001"
down_revision = None

_ACTIVE = sa.text("state IN ('preparing', 'running', 'aborting')")


def upgrade() -> None:
    op.create_table(
        "webhook_deliveries",
        sa.Column("delivery_key", sa.String(200), primary_key=True),
        sa.Column("delivery_id", sa.String(200), nullable=False),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("received_at", UTCDateTime(), nullable=False),
        sa.Column("signature_valid", sa.Boolean, nullable=False),
        sa.Column("normalized", sa.Boolean, nullable=False),
        sa.Column("task_id", sa.String(64)),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(64)),
        sa.Column("repo_key", sa.String(220)),
        sa.Column("comment_id", sa.BigInteger),
        sa.Column("payload_hash", sa.String(80), nullable=False),
        sa.Column("response_code", sa.Integer, nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_webhook_deliveries_received_at", "webhook_deliveries", ["received_at"])
    op.create_table(
        "repositories",
        sa.Column("repo_key", sa.String(220), primary_key=True),
        sa.Column("instance_id", sa.String(32), nullable=False),
        sa.Column("owner", sa.String(100), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("clone_url", sa.Text, nullable=False),
        sa.Column("workspace_path", sa.Text, nullable=False),
        sa.Column("default_branch", sa.String(255), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("worker_id", sa.String(200)),
        sa.Column("daily_token_budget", sa.BigInteger),
        sa.Column("monthly_token_budget", sa.BigInteger),
        sa.Column("registered_at", UTCDateTime(), nullable=False),
        sa.Column("last_fetch_at", UTCDateTime()),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
    )
    op.create_table(
        "sessions",
        sa.Column("session_key", sa.String(260), primary_key=True),
        sa.Column("resource_key", sa.String(260), nullable=False),
        sa.Column("repo_key", sa.String(220), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("thread_id", sa.String(200)),
        sa.Column("runtime", JSONText, nullable=False),
        sa.Column("mcp", JSONText, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("last_task_id", sa.String(64)),
        sa.Column("last_turn_id", sa.String(200)),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
    )
    op.create_index("ix_sessions_repo_key", "sessions", ["repo_key"])
    op.create_table(
        "tasks",
        sa.Column("task_id", sa.String(64), primary_key=True),
        sa.Column("delivery_key", sa.String(200), unique=True),
        sa.Column("repo_key", sa.String(220), nullable=False),
        sa.Column("resource_key", sa.String(260), nullable=False),
        sa.Column("session_key", sa.String(260), nullable=False),
        sa.Column("comment_id", sa.BigInteger),
        sa.Column("author", sa.String(100), nullable=False),
        sa.Column("instruction", sa.Text, nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("reply_attempt", sa.Integer, nullable=False),
        sa.Column("thread_id", sa.String(200)),
        sa.Column("turn_id", sa.String(200)),
        sa.Column("lease_id", sa.String(64)),
        sa.Column("next_retry_at", UTCDateTime()),
        sa.Column("error_code", sa.String(64)),
        sa.Column("execution_error", sa.Text),
        sa.Column("reply_error", sa.Text),
        sa.Column("refs", JSONText),
        sa.Column("retry_step", sa.String(32)),
        sa.Column("claimed_by", sa.String(200)),
        sa.Column("turn_count", sa.Integer, nullable=False, server_default="0"),
        sa.Column("input_tokens", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("output_tokens", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("state_version", sa.Integer, nullable=False),
    )
    op.create_index("ux_tasks_repo_comment", "tasks", ["repo_key", "comment_id"], unique=True)
    op.create_index("ix_tasks_state_created", "tasks", ["state", "created_at"])
    op.create_index("ix_tasks_resource", "tasks", ["resource_key", "created_at"])
    op.create_index(
        "ux_tasks_one_active_per_repo",
        "tasks",
        ["repo_key"],
        unique=True,
        sqlite_where=_ACTIVE,
        postgresql_where=_ACTIVE,
    )
    op.create_table(
        "turns",
        sa.Column("turn_key", sa.String(80), primary_key=True),
        sa.Column("turn_id", sa.String(200), unique=True),
        sa.Column("task_id", sa.String(64), nullable=False),
        sa.Column("thread_id", sa.String(200)),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("event_seq", sa.Integer, nullable=False),
        sa.Column("last_message", sa.Text),
        sa.Column("input_tokens", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("output_tokens", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("started_at", UTCDateTime()),
        sa.Column("completed_at", UTCDateTime()),
    )
    op.create_index("ix_turns_task_id", "turns", ["task_id"])
    op.create_table(
        "comments",
        sa.Column("comment_key", sa.String(120), primary_key=True),
        sa.Column("task_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("resource_key", sa.String(260), nullable=False),
        sa.Column("turn_id", sa.String(200)),
        sa.Column("turn_key", sa.String(80)),
        sa.Column("comment_id", sa.BigInteger),
        sa.Column("body_hash", sa.String(80)),
        sa.Column("body", sa.Text),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_comments_task_id", "comments", ["task_id"])
    op.create_table(
        "audit_events",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(64), nullable=False, unique=True),
        sa.Column("task_id", sa.String(64)),
        sa.Column("session_key", sa.String(260)),
        sa.Column("repo_key", sa.String(220)),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("from_state", sa.String(32)),
        sa.Column("to_state", sa.String(32)),
        sa.Column("state_version", sa.Integer),
        sa.Column("delivery_id", sa.String(200)),
        sa.Column("turn_id", sa.String(200)),
        sa.Column("comment_id", sa.BigInteger),
        sa.Column("error_code", sa.String(64)),
        sa.Column("timestamp", UTCDateTime(), nullable=False),
        sa.Column("metadata", JSONText),
    )
    op.create_index("ix_audit_task", "audit_events", ["task_id", "seq"])
    op.create_index("ix_audit_session", "audit_events", ["session_key", "seq"])
    op.create_index("ix_audit_repo", "audit_events", ["repo_key", "seq"])
    op.create_index("ix_audit_timestamp", "audit_events", ["timestamp"])
    op.create_table(
        "control",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("global_paused", sa.Boolean, nullable=False),
        sa.Column("pause_reason", sa.Text),
        sa.Column("updated_by", sa.String(200)),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
    )
    op.create_table(
        "control_requests",
        sa.Column("request_id", sa.String(200), primary_key=True),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(260), nullable=False),
        sa.Column("operator", sa.String(200), nullable=False),
        sa.Column("status_code", sa.Integer, nullable=False),
        sa.Column("response", JSONText, nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "domain_events",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("dedupe_key", sa.String(300), nullable=False, unique=True),
        sa.Column("repo_key", sa.String(220)),
        sa.Column("payload", JSONText, nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("dispatched_at", UTCDateTime()),
    )
    op.create_index("ix_domain_events_pending", "domain_events", ["dispatched_at", "seq"])
    op.create_table(
        "workers",
        sa.Column("worker_id", sa.String(200), primary_key=True),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("heartbeat_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "repo_leases",
        sa.Column("repo_key", sa.String(220), primary_key=True),
        sa.Column("lease_id", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("task_id", sa.String(64)),
        sa.Column("acquired_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    for table in (
        "repo_leases",
        "workers",
        "domain_events",
        "control_requests",
        "control",
        "audit_events",
        "comments",
        "turns",
        "tasks",
        "sessions",
        "repositories",
        "webhook_deliveries",
    ):
        op.drop_table(table)
