"""Queries of ``ui_gitea_logins``: a Gitea user's sign-in session (its ``ui_sessions``
row says whether it is live) and the user's sealed tokens."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, delete, insert, select, update

from forgeflow.store.bookkeeping_schema import ui_gitea_logins as t
from forgeflow.store.bookkeeping_schema import ui_sessions
from forgeflow.store.types import utcnow


@dataclass(frozen=True, slots=True)
class GiteaLogin:
    session_id: str
    login: str
    operator: bool
    sealed_tokens: str

    def __repr__(self) -> str:  # the sealed tokens stay out of every log line
        return f"GiteaLogin({self.session_id!r}, {self.login!r}, operator={self.operator})"


def put(conn: Connection, session_id: str, login: str, operator: bool, sealed: str) -> None:
    # Rows of sessions that are gone (ended, expired, removed) go with each new sign-in.
    live = select(ui_sessions.c.session_id).where(
        ui_sessions.c.ended_at.is_(None), ui_sessions.c.expires_at > utcnow()
    )
    conn.execute(delete(t).where(t.c.session_id.not_in(live)))
    conn.execute(
        insert(t).values(
            session_id=session_id,
            login=login[:100],
            operator=operator,
            sealed_tokens=sealed,
            updated_at=utcnow(),
        )
    )


def get(conn: Connection, session_id: str) -> GiteaLogin | None:
    row = conn.execute(
        select(t.c.session_id, t.c.login, t.c.operator, t.c.sealed_tokens).where(
            t.c.session_id == session_id
        )
    ).first()
    return None if row is None else GiteaLogin(row[0], row[1], bool(row[2]), row[3])


def reseal(conn: Connection, session_id: str, sealed: str) -> None:
    """The tokens after a refresh."""
    conn.execute(
        update(t)
        .where(t.c.session_id == session_id)
        .values(sealed_tokens=sealed, updated_at=utcnow())
    )


def forget(conn: Connection, session_id: str) -> None:
    conn.execute(delete(t).where(t.c.session_id == session_id))
