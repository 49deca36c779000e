"""A session's Codex thread kept for every worker (``session_threads``, issue #27): the
rollout ``thread/resume`` needs, bounded and redacted, written after each turn.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from forgeflow.store.types import UTCDateTime

revision = "0009"
down_revision = "0008"


def upgrade() -> None:
    op.create_table(
        "session_threads",
        sa.Column("session_key", sa.String(260), primary_key=True),
        sa.Column("thread_id", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("name", sa.String(200)),
        sa.Column("body", sa.Text()),
        sa.Column("lines", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("turn_key", sa.String(200)),
        sa.Column("detail", sa.Text()),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("session_threads")
