"""Cached input tokens per turn and per task (#25 item 2: the cost with prices).

Codex reports, per model response, the input tokens the provider served from its
cache (``cachedInputTokens``, a part of ``inputTokens``); a model's cached input is
often priced at a tenth of its input, so the cost needs them apart. Existing rows
get 0: their input is priced as uncached, as before.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"


def upgrade() -> None:
    for table in ("tasks", "turns"):
        op.add_column(
            table,
            sa.Column("cached_input_tokens", sa.BigInteger, nullable=False, server_default="0"),
        )


def downgrade() -> None:
    for table in ("turns", "tasks"):
        op.drop_column(table, "cached_input_tokens")
