"""Tables of the pipeline engine, on the store's one ``metadata``.

``migrations/versions/0002_pipelines.py`` creates exactly this; a test compares them.
A forEach node's items are rows beside the node's own row (``item_index`` -1).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Column, Float, Index, Integer, String, Table, Text

from forgeflow.store.metadata import metadata
from forgeflow.store.types import JSONText, UTCDateTime

pipeline_definitions = Table(
    "pipeline_definitions",
    metadata,
    Column("key", String(100), primary_key=True),
    Column("name", String(200), nullable=False),
    Column("version", Integer, nullable=False),
    Column("definition", JSONText, nullable=False),
    Column("is_enabled", Boolean, nullable=False),
    Column("built_in", Boolean, nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("revision", Integer, nullable=False),
)

pipeline_runs = Table(
    "pipeline_runs",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("template_key", String(100), nullable=False),
    Column("definition_version", Integer, nullable=False),
    Column("definition", JSONText, nullable=False),
    Column("status", String(16), nullable=False),
    Column("trigger_type", String(16), nullable=False),
    Column("event_type", String(100)),
    Column("dedupe_key", String(300), unique=True),
    Column("start_step_id", String(100), nullable=False),
    Column("inputs", JSONText, nullable=False),
    Column("state", JSONText, nullable=False),
    Column("cost", Float, nullable=False, server_default="0"),
    Column("input_tokens", BigInteger, nullable=False, server_default="0"),
    Column("output_tokens", BigInteger, nullable=False, server_default="0"),
    Column("error_code", String(64)),
    Column("error", Text),
    Column("parent_run_id", String(64)),
    Column("parent_step_id", String(100)),
    Column("parent_item_index", Integer),
    Column("created_by", String(200), nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("finished_at", UTCDateTime()),
    Column("version", Integer, nullable=False),
    Index("ix_pipeline_runs_status", "status"),
    Index("ix_pipeline_runs_template", "template_key", "created_at"),
    Index("ix_pipeline_runs_parent", "parent_run_id"),
)

pipeline_steps = Table(
    "pipeline_steps",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("step_id", String(100), primary_key=True),
    Column("item_index", Integer, primary_key=True, autoincrement=False),
    Column("kind", String(16), nullable=False),
    Column("body_key", String(200)),
    Column("status", String(16), nullable=False),
    Column("attempt", Integer, nullable=False),
    # The attempt a retry of the run started from: ``retry.attempts`` count from it.
    Column("retry_base", Integer, nullable=False, server_default="0"),
    Column("next_attempt_at", UTCDateTime()),
    Column("item", JSONText),
    Column("input", JSONText),
    Column("output", JSONText),
    Column("routes", JSONText),
    Column("suspend", JSONText),
    Column("error_code", String(64)),
    Column("error", Text),
    Column("claimed_by", String(200)),
    Column("lease_expires_at", UTCDateTime()),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("started_at", UTCDateTime()),
    Column("suspended_at", UTCDateTime()),
    Column("finished_at", UTCDateTime()),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("version", Integer, nullable=False),
    Index("ix_pipeline_steps_status_due", "status", "next_attempt_at"),
)

pipeline_triggers = Table(
    "pipeline_triggers",
    metadata,
    Column("trigger_id", String(64), primary_key=True),
    Column("template_key", String(100), nullable=False),
    Column("trigger_type", String(16), nullable=False),
    # '' when the trigger has no event type, so the unique key holds on every driver.
    Column("event_type", String(100), nullable=False),
    Column("match", JSONText),
    Column("schedule", String(200)),
    Column("webhook_token", String(100), unique=True),
    Column("is_enabled", Boolean, nullable=False),
    Column("last_fired_at", UTCDateTime()),
    Column("next_fire_at", UTCDateTime()),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Index(
        "ux_pipeline_triggers_template_type_event",
        "template_key",
        "trigger_type",
        "event_type",
        unique=True,
    ),
)

# Every call of a pipeline webhook trigger (``POST /webhooks/{token}``): accepted,
# duplicate or refused. An accepted call keeps its (redacted) body to be replayed; a
# refused one keeps none. Rows go after ``expires_at`` (delivery_retention_days).
pipeline_hook_deliveries = Table(
    "pipeline_hook_deliveries",
    metadata,
    Column("delivery_id", String(64), primary_key=True),
    Column("trigger_id", String(64), nullable=False),
    Column("template_key", String(100), nullable=False),
    Column("received_at", UTCDateTime(), nullable=False),
    Column("status", String(16), nullable=False),
    Column("reason", String(64)),
    Column("response_code", Integer, nullable=False),
    # The caller's identity of the call (``x-gitea-delivery:<id>``, …, ``body:<sha256>``).
    Column("call_key", String(300)),
    # SHA-256 of an accepted call's signed content: a replay under new headers is found.
    Column("body_digest", String(64)),
    Column("run_id", String(64)),
    Column("body", JSONText),
    Column("body_bytes", Integer, nullable=False),
    Column("expires_at", UTCDateTime(), nullable=False),
    Index("ix_pipeline_hook_deliveries_trigger", "trigger_id", "received_at"),
    Index("ix_pipeline_hook_deliveries_expires", "expires_at"),
    Index("ix_pipeline_hook_deliveries_digest", "trigger_id", "body_digest"),
)
