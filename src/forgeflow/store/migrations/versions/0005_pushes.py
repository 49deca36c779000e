"""Pushes of session branches (the agent's published work): intent and result.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from forgeflow.store.types import UTCDateTime

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    op.create_table(
        "pushes",
        sa.Column("push_key", sa.String(340), primary_key=True),
        sa.Column("task_id", sa.String(64), nullable=False),
        sa.Column("session_key", sa.String(260), nullable=False),
        sa.Column("target", sa.String(255), nullable=False),
        sa.Column("old_sha", sa.String(64)),
        sa.Column("new_sha", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text()),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_pushes_task_id", "pushes", ["task_id"])
    op.create_index("ix_pushes_session_key", "pushes", ["session_key"])


def downgrade() -> None:
    op.drop_index("ix_pushes_session_key", "pushes")
    op.drop_index("ix_pushes_task_id", "pushes")
    op.drop_table("pushes")
