"""A mention's options (#25 item 4): ``tasks.model`` and ``tasks.max_tokens``.

``model``: the model the mention asked for with ``--model`` (one the operator allows),
NULL for the configured one; ``max_tokens``: the task's own token cap from
``--max-tokens``, NULL for none (the repository's budgets still apply).

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"


def upgrade() -> None:
    # Nullable, no default: a plain ADD COLUMN on both drivers (the partial unique
    # index of tasks stays as it is).
    op.add_column("tasks", sa.Column("model", sa.String(100)))
    op.add_column("tasks", sa.Column("max_tokens", sa.BigInteger))


def downgrade() -> None:
    op.drop_column("tasks", "max_tokens")
    op.drop_column("tasks", "model")
