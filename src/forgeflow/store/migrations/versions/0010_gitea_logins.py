"""Sign in with Gitea (#25 item 3): a Gitea user's session keeps the user's tokens,
sealed, beside its ``ui_sessions`` row.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from forgeflow.store.types import UTCDateTime

revision = "0010"
down_revision = "0009"


def upgrade() -> None:
    op.create_table(
        "ui_gitea_logins",
        sa.Column("session_id", sa.String(64), primary_key=True),
        sa.Column("login", sa.String(100), nullable=False),
        sa.Column("operator", sa.Boolean(), nullable=False),
        sa.Column("sealed_tokens", sa.Text(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("ui_gitea_logins")
