"""Pipeline run retry (``pipeline_steps.retry_base``) and the delivery log of pipeline
webhook triggers (``pipeline_hook_deliveries``).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from forgeflow.store.types import JSONText, UTCDateTime

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    with op.batch_alter_table("pipeline_steps") as batch:
        batch.add_column(sa.Column("retry_base", sa.Integer(), nullable=False, server_default="0"))
    op.create_table(
        "pipeline_hook_deliveries",
        sa.Column("delivery_id", sa.String(64), primary_key=True),
        sa.Column("trigger_id", sa.String(64), nullable=False),
        sa.Column("template_key", sa.String(100), nullable=False),
        sa.Column("received_at", UTCDateTime(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(64)),
        sa.Column("response_code", sa.Integer(), nullable=False),
        sa.Column("call_key", sa.String(300)),
        sa.Column("run_id", sa.String(64)),
        sa.Column("body", JSONText()),
        sa.Column("body_bytes", sa.Integer(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
    )
    op.create_index(
        "ix_pipeline_hook_deliveries_trigger",
        "pipeline_hook_deliveries",
        ["trigger_id", "received_at"],
    )
    op.create_index(
        "ix_pipeline_hook_deliveries_expires", "pipeline_hook_deliveries", ["expires_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_pipeline_hook_deliveries_expires", "pipeline_hook_deliveries")
    op.drop_index("ix_pipeline_hook_deliveries_trigger", "pipeline_hook_deliveries")
    op.drop_table("pipeline_hook_deliveries")
    with op.batch_alter_table("pipeline_steps") as batch:
        batch.drop_column("retry_base")
