"""The HTTP surface: the body digest of an accepted pipeline webhook call
(``pipeline_hook_deliveries.body_digest``, for replay resistance) and the admin pages'
sign-in sessions (``ui_sessions``, so signing out ends a session on the server).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from forgeflow.store.types import UTCDateTime

revision = "0008"
down_revision = "0007"


def upgrade() -> None:
    with op.batch_alter_table("pipeline_hook_deliveries") as batch:
        batch.add_column(sa.Column("body_digest", sa.String(64)))
    op.create_index(
        "ix_pipeline_hook_deliveries_digest",
        "pipeline_hook_deliveries",
        ["trigger_id", "body_digest"],
    )
    op.create_table(
        "ui_sessions",
        sa.Column("session_id", sa.String(64), primary_key=True),
        sa.Column("operator", sa.String(100), nullable=False),
        sa.Column("address", sa.String(64)),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("ended_at", UTCDateTime()),
        sa.Column("ended_by", sa.String(200)),
    )
    op.create_index("ix_ui_sessions_expires", "ui_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_ui_sessions_expires", "ui_sessions")
    op.drop_table("ui_sessions")
    op.drop_index("ix_pipeline_hook_deliveries_digest", "pipeline_hook_deliveries")
    with op.batch_alter_table("pipeline_hook_deliveries") as batch:
        batch.drop_column("body_digest")
