"""Conversation modes of pipeline spaces (``messaging.createSpace`` ``extras.mode``).

``sessions.mode``: NULL for a resource's own session (the mention workflow's thread,
full access); ``plan`` or ``review`` for a pipeline space, a session of its own keyed
by run and resource whose thread is read-only and has no Gitea MCP server.
``tasks.mode``: the mode a task runs in, copied from its space when it is created;
NULL for mentions. A ``plan``/``review`` task is a draft: nothing is posted on Gitea.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    # Plain ALTER TABLE ADD COLUMN (nullable, no default) on both drivers: no table
    # copy, so the partial unique index of tasks stays as it is.
    op.add_column("sessions", sa.Column("mode", sa.String(16)))
    op.add_column("tasks", sa.Column("mode", sa.String(16)))


def downgrade() -> None:
    op.drop_column("tasks", "mode")
    op.drop_column("sessions", "mode")
