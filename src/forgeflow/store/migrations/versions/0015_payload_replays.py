"""Deliveries without a comment id are recognised again by their payload (issue #24): a
unique index on the accepted deliveries of review requests and of reviews whose summary
mentions the bot, so two replays that arrive at the same instant on PostgreSQL cannot
both make a task. Earlier duplicates (the race this closes) are marked ``duplicate``
first, the oldest delivery kept.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"

_WHERE = (
    "event_type IN ('pull_request_review_request', 'pull_request_review_comment', "
    "'pull_request_review_approved', 'pull_request_review_rejected') "
    "AND comment_id IS NULL AND status = 'accepted'"
)
_LATER_DUPLICATES = sa.text(
    "UPDATE webhook_deliveries SET status = 'duplicate', "
    "reason = 'request_already_accepted', response_code = 200 "
    "WHERE event_type IN ('pull_request_review_request', 'pull_request_review_comment', "
    "'pull_request_review_approved', 'pull_request_review_rejected') "
    "AND comment_id IS NULL AND status = 'accepted' "
    "AND EXISTS (SELECT 1 FROM webhook_deliveries e "
    "WHERE e.repo_key = webhook_deliveries.repo_key "
    "AND e.payload_hash = webhook_deliveries.payload_hash "
    "AND e.event_type = webhook_deliveries.event_type AND e.comment_id IS NULL "
    "AND e.status = 'accepted' "
    "AND (e.received_at < webhook_deliveries.received_at "
    "OR (e.received_at = webhook_deliveries.received_at "
    "AND e.delivery_key < webhook_deliveries.delivery_key)))"
)


def upgrade() -> None:
    op.execute(_LATER_DUPLICATES)
    op.create_index(
        "ux_webhook_deliveries_by_payload",
        "webhook_deliveries",
        ["repo_key", "event_type", "payload_hash"],
        unique=True,
        sqlite_where=sa.text(_WHERE),
        postgresql_where=sa.text(_WHERE),
    )


def downgrade() -> None:
    op.drop_index("ux_webhook_deliveries_by_payload", table_name="webhook_deliveries")
