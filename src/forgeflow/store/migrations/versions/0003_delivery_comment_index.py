"""An index for recognising Gitea's replay of a comment; domain events before triggers.

Without the index every accepted mention scanned ``webhook_deliveries`` for an earlier
delivery of the same comment, a cost that grew with the table.

Domain events were recorded before anything dispatched them; the trigger dispatcher
that arrives with this revision must not fire pipelines for that history, so the
events already recorded are marked dispatched.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    op.create_index(
        "ix_webhook_deliveries_repo_comment", "webhook_deliveries", ["repo_key", "comment_id"]
    )
    op.execute(
        sa.text("UPDATE domain_events SET dispatched_at = created_at WHERE dispatched_at IS NULL")
    )


def downgrade() -> None:
    op.drop_index("ix_webhook_deliveries_repo_comment", table_name="webhook_deliveries")
