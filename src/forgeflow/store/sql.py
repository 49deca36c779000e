"""Small SQL helpers shared by the query modules."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Table, literal_column, text
from sqlalchemy.dialects import postgresql, sqlite


def insert_ignore(conn: Connection, table: Table, values: dict[str, Any]) -> bool:
    """Insert unless a unique key already holds the row; True when this call inserted.

    On PostgreSQL a concurrent insert of the same key waits for the other transaction,
    so the caller's next read sees the winner's row.
    """
    if conn.dialect.name == "postgresql":
        stmt: Any = postgresql.insert(table).values(**values).on_conflict_do_nothing()
    else:
        stmt = sqlite.insert(table).values(**values).on_conflict_do_nothing()
    # RETURNING tells reliably whether a row went in; rowcount does not on every driver.
    return conn.execute(stmt.returning(literal_column("1"))).first() is not None


TASKS_CHANNEL = "forgeflow_tasks"


def notify_tasks(conn: Connection) -> None:
    """Tell every worker that a task may have become claimable.

    On PostgreSQL the notification is delivered when the caller's transaction commits,
    so no worker wakes up before the row is visible. SQLite runs one process; its
    in-process wake-up does the same job.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(text(f"NOTIFY {TASKS_CHANNEL}"))
