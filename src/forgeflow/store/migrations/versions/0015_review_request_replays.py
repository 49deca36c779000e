"""A review request's replay is recognised by its payload (issue #24): a unique index
on the accepted deliveries of review requests, so two replays that arrive at the same
instant on PostgreSQL cannot both make a task. Earlier duplicates (the race this
closes) are marked ``duplicate`` first, the oldest delivery kept.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"

_WHERE = "event_type = 'pull_request_review_request' AND comment_id IS NULL AND status = 'accepted'"


def upgrade() -> None:
    op.execute(
        sa.text(
            "UPDATE webhook_deliveries SET status = 'duplicate', "
            "reason = 'request_already_accepted', response_code = 200 "
            "WHERE event_type = 'pull_request_review_request' AND comment_id IS NULL "
            "AND status = 'accepted' AND EXISTS (SELECT 1 FROM webhook_deliveries e "
            "WHERE e.repo_key = webhook_deliveries.repo_key "
            "AND e.payload_hash = webhook_deliveries.payload_hash "
            "AND e.event_type = 'pull_request_review_request' AND e.comment_id IS NULL "
            "AND e.status = 'accepted' "
            "AND (e.received_at < webhook_deliveries.received_at "
            "OR (e.received_at = webhook_deliveries.received_at "
            "AND e.delivery_key < webhook_deliveries.delivery_key)))"
        )
    )
    op.create_index(
        "ux_webhook_deliveries_review_request",
        "webhook_deliveries",
        ["repo_key", "payload_hash"],
        unique=True,
        sqlite_where=sa.text(_WHERE),
        postgresql_where=sa.text(_WHERE),
    )


def downgrade() -> None:
    op.drop_index("ux_webhook_deliveries_review_request", table_name="webhook_deliveries")
