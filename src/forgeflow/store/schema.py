"""The tables, as SQLAlchemy Core metadata.

Migrations in ``migrations/versions`` create exactly this; a test compares the two.
Unique keys live here, in the database, so a bug in Python cannot break them.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Index,
    Integer,
    String,
    Table,
    Text,
    text,
)

from forgeflow.domain.states import ACTIVE_STATES, TaskState, values
from forgeflow.store.metadata import metadata as metadata  # re-exported: migrations read it here
from forgeflow.store.types import JSONText, UTCDateTime


def state_in(states: frozenset[TaskState]) -> str:
    """``state IN (...)`` as SQL text (a partial index's condition, which both dialects
    read), derived from the state set and in the table's order (stable text)."""
    return "state IN ({})".format(", ".join(f"'{v}'" for v in values(states)))


ACTIVE_STATES_SQL = state_in(ACTIVE_STATES)
# A review request, or a review whose summary mentions the bot, has no comment id: its
# accepted delivery is unique by its payload, so two replays of it that arrive at the
# same instant cannot both make a task (gitea/webhook.py BY_PAYLOAD).
BY_PAYLOAD_ACCEPTED_SQL = (
    "event_type IN ('pull_request_review_request', 'pull_request_review_comment', "
    "'pull_request_review_approved', 'pull_request_review_rejected') "
    "AND comment_id IS NULL AND status = 'accepted'"
)

webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("delivery_key", String(200), primary_key=True),
    Column("delivery_id", String(200), nullable=False),
    Column("event_type", String(64), nullable=False),
    Column("received_at", UTCDateTime(), nullable=False),
    Column("signature_valid", Boolean, nullable=False),
    Column("normalized", Boolean, nullable=False),
    Column("task_id", String(64)),
    Column("status", String(16), nullable=False),
    Column("reason", String(64)),
    Column("repo_key", String(220)),
    Column("comment_id", BigInteger),
    Column("payload_hash", String(80), nullable=False),
    Column("response_code", Integer, nullable=False),
    Column("expires_at", UTCDateTime(), nullable=False),
    Index("ix_webhook_deliveries_received_at", "received_at"),
    Index("ix_webhook_deliveries_repo_comment", "repo_key", "comment_id"),
    Index(
        "ux_webhook_deliveries_by_payload",
        "repo_key",
        "event_type",
        "payload_hash",
        unique=True,
        sqlite_where=text(BY_PAYLOAD_ACCEPTED_SQL),
        postgresql_where=text(BY_PAYLOAD_ACCEPTED_SQL),
    ),
)

repositories = Table(
    "repositories",
    metadata,
    Column("repo_key", String(220), primary_key=True),
    Column("instance_id", String(32), nullable=False),
    Column("owner", String(100), nullable=False),
    Column("name", String(100), nullable=False),
    Column("clone_url", Text, nullable=False),
    Column("workspace_path", Text, nullable=False),
    Column("default_branch", String(255), nullable=False),
    Column("status", String(16), nullable=False),
    Column("worker_id", String(200)),
    Column("daily_token_budget", BigInteger),
    Column("monthly_token_budget", BigInteger),
    Column("registered_at", UTCDateTime(), nullable=False),
    Column("last_fetch_at", UTCDateTime()),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("version", Integer, nullable=False),
)

sessions = Table(
    "sessions",
    metadata,
    Column("session_key", String(260), primary_key=True),
    Column("resource_key", String(260), nullable=False),
    Column("repo_key", String(220), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("number", Integer, nullable=False),
    Column("thread_id", String(200)),
    Column("runtime", JSONText, nullable=False),
    Column("mcp", JSONText, nullable=False),
    Column("status", String(16), nullable=False),
    Column("last_task_id", String(64)),
    Column("last_turn_id", String(200)),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("version", Integer, nullable=False),
    # NULL: the resource's own (mention) session; plan/review: a pipeline space (0004).
    Column("mode", String(16)),
    Index("ix_sessions_repo_key", "repo_key"),
)

tasks = Table(
    "tasks",
    metadata,
    Column("task_id", String(64), primary_key=True),
    Column("delivery_key", String(200), unique=True),
    Column("repo_key", String(220), nullable=False),
    Column("resource_key", String(260), nullable=False),
    Column("session_key", String(260), nullable=False),
    Column("comment_id", BigInteger),
    Column("author", String(100), nullable=False),
    Column("instruction", Text, nullable=False),
    Column("state", String(32), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("reply_attempt", Integer, nullable=False),
    Column("thread_id", String(200)),
    Column("turn_id", String(200)),
    Column("lease_id", String(64)),
    Column("next_retry_at", UTCDateTime()),
    Column("error_code", String(64)),
    Column("execution_error", Text),
    Column("reply_error", Text),
    Column("refs", JSONText),
    Column("retry_step", String(32)),
    Column("claimed_by", String(200)),
    Column("turn_count", Integer, nullable=False, server_default="0"),
    Column("input_tokens", BigInteger, nullable=False, server_default="0"),
    Column("output_tokens", BigInteger, nullable=False, server_default="0"),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("state_version", Integer, nullable=False),
    # The conversation mode of a pipeline task (from its space); NULL for mentions (0004).
    Column("mode", String(16)),
    # A mention's ``--model`` and ``--max-tokens`` (0010); NULL: the defaults.
    Column("model", String(100)),
    Column("max_tokens", BigInteger),
    # The part of input_tokens served from the provider's cache (0013).
    Column("cached_input_tokens", BigInteger, nullable=False, server_default="0"),
    # Gitea's replay sends the same comment under a new delivery id.
    Index("ux_tasks_repo_comment", "repo_key", "comment_id", unique=True),
    Index("ix_tasks_state_created", "state", "created_at"),
    Index("ix_tasks_resource", "resource_key", "created_at"),
    # Enforced by the database, not by Python: one active task per repository.
    Index(
        "ux_tasks_one_active_per_repo",
        "repo_key",
        unique=True,
        sqlite_where=text(ACTIVE_STATES_SQL),
        postgresql_where=text(ACTIVE_STATES_SQL),
    ),
)

turns = Table(
    "turns",
    metadata,
    Column("turn_key", String(80), primary_key=True),
    Column("turn_id", String(200), unique=True),
    Column("task_id", String(64), nullable=False),
    Column("thread_id", String(200)),
    Column("kind", String(16), nullable=False),
    Column("status", String(16), nullable=False),
    Column("event_seq", Integer, nullable=False),
    Column("last_message", Text),
    Column("input_tokens", BigInteger, nullable=False, server_default="0"),
    Column("output_tokens", BigInteger, nullable=False, server_default="0"),
    Column("started_at", UTCDateTime()),
    Column("completed_at", UTCDateTime()),
    Column("cached_input_tokens", BigInteger, nullable=False, server_default="0"),  # 0013
    Index("ix_turns_task_id", "task_id"),
)

# What the agent did in each turn, one row per finished item (the task page's transcript).
# Bounded and redacted before it gets here (domain/transcript.py); kept as long as the task.
transcript_entries = Table(
    "transcript_entries",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("task_id", String(64), nullable=False),
    Column("turn_id", String(200), nullable=False),
    Column("item_id", String(200), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("title", Text, nullable=False),
    Column("body", Text, nullable=False),
    Column("status", String(32)),
    Column("exit_code", Integer),
    Column("truncated", Boolean, nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    # An item recorded twice (a replayed notification) stays one entry.
    Index("ux_transcript_item", "turn_id", "item_id", unique=True),
    Index("ix_transcript_task", "task_id", "seq"),
)

# What ``thread/resume`` needs on a worker that never had the session's thread: its
# Codex rollout, bounded and redacted (domain/rollout.py), kept after each turn (#27).
# ``body`` is NULL when the last turn's rollout could not be kept (``status`` says why).
session_threads = Table(
    "session_threads",
    metadata,
    Column("session_key", String(260), primary_key=True),
    Column("thread_id", String(200), nullable=False),
    Column("status", String(16), nullable=False),
    Column("name", String(200)),
    Column("body", Text),
    Column("lines", Integer, nullable=False),
    Column("bytes", Integer, nullable=False),
    Column("turn_key", String(200)),
    Column("detail", Text),
    Column("updated_at", UTCDateTime(), nullable=False),
)

# A repository's environment as the operator declared it (issue #26, domain/
# environment.py): ``spec`` is its JSON. Its setup secrets apart, never answered back.
repo_environments = Table(
    "repo_environments",
    metadata,
    Column("repo_key", String(220), primary_key=True),
    Column("spec", JSONText, nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
)

environment_secrets = Table(
    "environment_secrets",
    metadata,
    Column("repo_key", String(220), primary_key=True),
    Column("name", String(100), primary_key=True),
    Column("value", Text, nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
)

# The roots built for a package list and suite (``root_key``), as the operators see
# them: building, ready or failed, with the build's bounded log, size and last use.
environment_roots = Table(
    "environment_roots",
    metadata,
    Column("root_key", String(64), primary_key=True),
    Column("suite", String(40), nullable=False),
    Column("packages", JSONText, nullable=False),
    Column("state", String(16), nullable=False),
    Column("size_bytes", BigInteger),
    Column("log", Text),
    Column("started_at", UTCDateTime(), nullable=False),
    Column("finished_at", UTCDateTime()),
    Column("last_used_at", UTCDateTime()),
    Column("removed_at", UTCDateTime()),
)

# Each repository's last setup run: what it ran for (``fingerprint``), how it ended,
# its log (bounded, redacted) and the task it ran in.
environment_setups = Table(
    "environment_setups",
    metadata,
    Column("repo_key", String(220), primary_key=True),
    Column("fingerprint", String(64), nullable=False),
    Column("root_key", String(64)),
    Column("state", String(16), nullable=False),
    Column("log", Text),
    Column("task_id", String(64)),
    Column("started_at", UTCDateTime(), nullable=False),
    Column("finished_at", UTCDateTime()),
)

# The bookkeeping tables (comments, pushes, audit, control, leases, workers, sign-in
# sessions, domain events) and the pipeline tables live in their own modules on this
# same metadata; importing them here keeps ``metadata`` complete for whoever imports
# only this module (migrations, tests).
from forgeflow.store import bookkeeping_schema as _bookkeeping_schema  # noqa: E402, F401
from forgeflow.store import pipeline_schema as _pipeline_schema  # noqa: E402, F401
