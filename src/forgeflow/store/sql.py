"""Small SQL helpers shared by the query modules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Insert, RowMapping, Table, literal_column, text
from sqlalchemy.dialects import postgresql, sqlite

# Statements built once per (dialect, table): building a Core statement per call costs
# more CPU than SQLite spends running it, and the webhook's hot path inserts several.
_INSERT_IGNORE: dict[tuple[str, str], Any] = {}
_INSERT: dict[str, Insert] = {}


def insert_ignore(conn: Connection, table: Table, values: Mapping[str, object]) -> bool:
    """Insert unless a unique key already holds the row; True when this call inserted.

    On PostgreSQL a concurrent insert of the same key waits for the other transaction,
    so the caller's next read sees the winner's row.
    """
    dialect = conn.dialect.name
    stmt = _INSERT_IGNORE.get((dialect, table.name))
    if stmt is None:
        module: Any = postgresql if dialect == "postgresql" else sqlite
        # RETURNING tells reliably whether a row went in; rowcount does not on every driver.
        stmt = module.insert(table).on_conflict_do_nothing().returning(literal_column("1"))
        _INSERT_IGNORE[(dialect, table.name)] = stmt
    return conn.execute(stmt, values).first() is not None


def insert_row(conn: Connection, table: Table, values: Mapping[str, object]) -> None:
    """A plain INSERT of one row through a statement built once per table."""
    insert_rows(conn, table, [values])


def insert_rows(conn: Connection, table: Table, rows: Sequence[Mapping[str, object]]) -> None:
    """Plain INSERTs of rows that all give the same columns (their values go to
    SQLAlchemy unread, hence ``object``)."""
    stmt = _INSERT.get(table.name)
    if stmt is None:
        stmt = _INSERT[table.name] = table.insert()
    conn.execute(stmt, rows[0] if len(rows) == 1 else list(rows))


# Statements the hot paths build once (module constants with ``bindparam``) run through
# these. Rows of the tables that have a record are read through ``rows.py`` and come
# back typed; ``first`` gives a partial read (a few columns) as SQLAlchemy maps it.
def first(conn: Connection, stmt: Any, params: Mapping[str, object]) -> RowMapping | None:
    return conn.execute(stmt, dict(params)).mappings().first()


def scalar(conn: Connection, stmt: Any, params: Mapping[str, Any]) -> Any:
    """The first column of the first row, or None."""
    row = first(conn, stmt, params)
    return None if row is None else next(iter(row.values()))


def execute_many(conn: Connection, stmt: Any, params: Sequence[Mapping[str, Any]]) -> None:
    """One statement for each parameter set (``executemany``)."""
    conn.execute(stmt, [dict(p) for p in params])


def execute(conn: Connection, stmt: Any, params: Mapping[str, Any]) -> int:
    """A statement without result rows; returns how many rows it changed."""
    return int(conn.execute(stmt, dict(params)).rowcount)


TASKS_CHANNEL = "forgeflow_tasks"


def notify_tasks(conn: Connection) -> None:
    """Tell every worker that a task may have become claimable.

    On PostgreSQL the notification is delivered when the caller's transaction commits,
    so no worker wakes up before the row is visible. SQLite runs one process; its
    in-process wake-up does the same job.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(text(f"NOTIFY {TASKS_CHANNEL}"))
