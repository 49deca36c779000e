"""Repositories' environments (issue #26): the operator's declaration, its setup
secrets, the roots built for package lists and each repository's last setup run.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from forgeflow.store.types import JSONText, UTCDateTime

revision = "0012"
down_revision = "0011"


def upgrade() -> None:
    op.create_table(
        "repo_environments",
        sa.Column("repo_key", sa.String(220), primary_key=True),
        sa.Column("spec", JSONText(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "environment_secrets",
        sa.Column("repo_key", sa.String(220), primary_key=True),
        sa.Column("name", sa.String(100), primary_key=True),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "environment_roots",
        sa.Column("root_key", sa.String(64), primary_key=True),
        sa.Column("suite", sa.String(40), nullable=False),
        sa.Column("packages", JSONText(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("size_bytes", sa.BigInteger()),
        sa.Column("log", sa.Text()),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("finished_at", UTCDateTime()),
        sa.Column("last_used_at", UTCDateTime()),
    )
    op.create_table(
        "environment_setups",
        sa.Column("repo_key", sa.String(220), primary_key=True),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("root_key", sa.String(64)),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("log", sa.Text()),
        sa.Column("task_id", sa.String(64)),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("finished_at", UTCDateTime()),
    )


def downgrade() -> None:
    for name in ("environment_setups", "environment_roots", "environment_secrets",
                 "repo_environments"):  # fmt: skip
        op.drop_table(name)
