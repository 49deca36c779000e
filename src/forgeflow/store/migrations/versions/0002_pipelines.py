"""Pipeline engine tables: definitions, runs, steps, triggers.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from forgeflow.store.types import JSONText, UTCDateTime

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    op.create_table(
        "pipeline_definitions",
        sa.Column("key", sa.String(100), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("definition", JSONText, nullable=False),
        sa.Column("is_enabled", sa.Boolean, nullable=False),
        sa.Column("built_in", sa.Boolean, nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("revision", sa.Integer, nullable=False),
    )
    op.create_table(
        "pipeline_runs",
        sa.Column("run_id", sa.String(64), primary_key=True),
        sa.Column("template_key", sa.String(100), nullable=False),
        sa.Column("definition_version", sa.Integer, nullable=False),
        sa.Column("definition", JSONText, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("trigger_type", sa.String(16), nullable=False),
        sa.Column("event_type", sa.String(100)),
        sa.Column("dedupe_key", sa.String(300), unique=True),
        sa.Column("start_step_id", sa.String(100), nullable=False),
        sa.Column("inputs", JSONText, nullable=False),
        sa.Column("state", JSONText, nullable=False),
        sa.Column("cost", sa.Float, nullable=False, server_default="0"),
        sa.Column("input_tokens", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("output_tokens", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("error_code", sa.String(64)),
        sa.Column("error", sa.Text),
        sa.Column("parent_run_id", sa.String(64)),
        sa.Column("parent_step_id", sa.String(100)),
        sa.Column("parent_item_index", sa.Integer),
        sa.Column("created_by", sa.String(200), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("finished_at", UTCDateTime()),
        sa.Column("version", sa.Integer, nullable=False),
    )
    op.create_index("ix_pipeline_runs_status", "pipeline_runs", ["status"])
    op.create_index("ix_pipeline_runs_template", "pipeline_runs", ["template_key", "created_at"])
    op.create_index("ix_pipeline_runs_parent", "pipeline_runs", ["parent_run_id"])
    op.create_table(
        "pipeline_steps",
        sa.Column("run_id", sa.String(64), primary_key=True),
        sa.Column("step_id", sa.String(100), primary_key=True),
        sa.Column("item_index", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("body_key", sa.String(200)),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", UTCDateTime()),
        sa.Column("item", JSONText),
        sa.Column("input", JSONText),
        sa.Column("output", JSONText),
        sa.Column("routes", JSONText),
        sa.Column("suspend", JSONText),
        sa.Column("error_code", sa.String(64)),
        sa.Column("error", sa.Text),
        sa.Column("claimed_by", sa.String(200)),
        sa.Column("lease_expires_at", UTCDateTime()),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("started_at", UTCDateTime()),
        sa.Column("suspended_at", UTCDateTime()),
        sa.Column("finished_at", UTCDateTime()),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
    )
    op.create_index("ix_pipeline_steps_status_due", "pipeline_steps", ["status", "next_attempt_at"])
    op.create_table(
        "pipeline_triggers",
        sa.Column("trigger_id", sa.String(64), primary_key=True),
        sa.Column("template_key", sa.String(100), nullable=False),
        sa.Column("trigger_type", sa.String(16), nullable=False),
        sa.Column("event_type", sa.String(100), nullable=False),
        sa.Column("match", JSONText),
        sa.Column("schedule", sa.String(200)),
        sa.Column("webhook_token", sa.String(100), unique=True),
        sa.Column("is_enabled", sa.Boolean, nullable=False),
        sa.Column("last_fired_at", UTCDateTime()),
        sa.Column("next_fire_at", UTCDateTime()),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )
    op.create_index(
        "ux_pipeline_triggers_template_type_event",
        "pipeline_triggers",
        ["template_key", "trigger_type", "event_type"],
        unique=True,
    )


def downgrade() -> None:
    for table in ("pipeline_triggers", "pipeline_steps", "pipeline_runs", "pipeline_definitions"):
        op.drop_table(table)
