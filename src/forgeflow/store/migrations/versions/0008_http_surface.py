"""Pipeline trigger replay resistance: the body digest of an accepted webhook call
(``pipeline_hook_deliveries.body_digest``), looked up per trigger.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

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


def downgrade() -> None:
    op.drop_index("ix_pipeline_hook_deliveries_digest", "pipeline_hook_deliveries")
    with op.batch_alter_table("pipeline_hook_deliveries") as batch:
        batch.drop_column("body_digest")
