"""Queries of ``ui_sessions``: the admin pages' sign-in sessions (the signed cookie names
a row; a session is live while its row is neither ended nor expired)."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Connection, delete, insert, select, update

from forgeflow.domain.bookkeeping import UiSession
from forgeflow.store import rows
from forgeflow.store.bookkeeping_schema import ui_gitea_logins
from forgeflow.store.bookkeeping_schema import ui_sessions as t
from forgeflow.store.types import utcnow

# Rows kept after they end or expire, for the operator's list; then deleted.
KEPT = timedelta(days=7)


def start(conn: Connection, session_id: str, operator: str, address: str, ttl: float) -> None:
    now = utcnow()
    conn.execute(delete(t).where(t.c.expires_at < now - KEPT))
    conn.execute(
        insert(t).values(
            session_id=session_id,
            operator=operator,
            address=address[:64],
            created_at=now,
            expires_at=now + timedelta(seconds=ttl),
        )
    )


def is_live(conn: Connection, session_id: str, now: datetime) -> bool:
    row = conn.execute(
        select(t.c.session_id).where(
            t.c.session_id == session_id, t.c.ended_at.is_(None), t.c.expires_at > now
        )
    ).first()
    return row is not None


def end(conn: Connection, session_id: str, by: str) -> bool:
    """End a live session; False when there is none by that id (or it already ended)."""
    done = conn.execute(
        update(t)
        .where(t.c.session_id == session_id, t.c.ended_at.is_(None))
        .values(ended_at=utcnow(), ended_by=by[:200])
    )
    # A Gitea user's tokens are of no use once the session ended: gone with it.
    conn.execute(delete(ui_gitea_logins).where(ui_gitea_logins.c.session_id == session_id))
    return bool(done.rowcount)


def listing(conn: Connection, *, live_only: bool) -> list[UiSession]:
    q = select(t).order_by(t.c.created_at.desc()).limit(500)
    if live_only:
        q = q.where(t.c.ended_at.is_(None), t.c.expires_at > utcnow())
    return rows.every(UiSession, conn, q, {})
