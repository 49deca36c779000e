"""Turn transcripts: what the agent said and did, one row per finished item.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from forgeflow.store.types import UTCDateTime

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    op.create_table(
        "transcript_entries",
        sa.Column("seq", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("task_id", sa.String(64), nullable=False),
        sa.Column("turn_id", sa.String(200), nullable=False),
        sa.Column("item_id", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("status", sa.String(32)),
        sa.Column("exit_code", sa.Integer()),
        sa.Column("truncated", sa.Boolean(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )
    op.create_index("ux_transcript_item", "transcript_entries", ["turn_id", "item_id"], unique=True)
    op.create_index("ix_transcript_task", "transcript_entries", ["task_id", "seq"])


def downgrade() -> None:
    op.drop_index("ix_transcript_task", "transcript_entries")
    op.drop_index("ux_transcript_item", "transcript_entries")
    op.drop_table("transcript_entries")
