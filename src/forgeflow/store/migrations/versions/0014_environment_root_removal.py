"""When an environment's root was removed (issue #26): a root that no repository's
environment names and no jail uses is deleted, its row kept with state ``removed``.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from forgeflow.store.types import UTCDateTime

revision = "0014"
down_revision = "0013"


def upgrade() -> None:
    with op.batch_alter_table("environment_roots") as batch:
        batch.add_column(sa.Column("removed_at", UTCDateTime()))


def downgrade() -> None:
    with op.batch_alter_table("environment_roots") as batch:
        batch.drop_column("removed_at")
