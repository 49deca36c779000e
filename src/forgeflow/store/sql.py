"""Small SQL helpers shared by the query modules."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Insert, Table, literal_column, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError

# Statements built once per (dialect, table): building a Core statement per call costs
# more CPU than SQLite spends running it, and the webhook's hot path inserts several.
_INSERT_IGNORE: dict[tuple[str, str], Any] = {}
_INSERT: dict[str, Insert] = {}


def insert_ignore(conn: Connection, table: Table, values: dict[str, Any]) -> bool:
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
    direct = _direct(conn, stmt, table, values)
    if direct is not None:
        return direct.run(conn, [values], returns=True)
    return conn.execute(stmt, values).first() is not None


def insert_row(conn: Connection, table: Table, values: dict[str, Any]) -> None:
    """A plain INSERT of one row through a statement built once per table."""
    insert_rows(conn, table, [values])


def insert_rows(conn: Connection, table: Table, rows: Sequence[dict[str, Any]]) -> None:
    """Plain INSERTs of rows that all give the same columns."""
    stmt = _INSERT.get(table.name)
    if stmt is None:
        stmt = _INSERT[table.name] = table.insert()
    direct = _direct(conn, stmt, table, rows[0])
    if direct is not None:
        direct.run(conn, rows, returns=False)
    else:
        conn.execute(stmt, rows[0] if len(rows) == 1 else list(rows))


# SQLite's one writer thread is forgeflow's bottleneck, and for a short INSERT
# SQLAlchemy's execute machinery (execution context, parameter and result set-up) cost
# several times what SQLite spent running it. So on SQLite these INSERTs are compiled
# once per set of columns and run on the driver's own cursor, with SQLAlchemy's bind
# processors (datetimes, JSON, booleans) and its exception classes. PostgreSQL keeps the
# plain path: a network round trip dwarfs the difference there.
@dataclass(frozen=True, slots=True)
class _Direct:
    sql: str
    order: tuple[str, ...]
    processors: Mapping[str, Callable[[Any], Any]]

    def _params(self, values: Mapping[str, Any]) -> tuple[Any, ...]:
        p = self.processors
        return tuple(p[k](values[k]) if k in p else values[k] for k in self.order)

    def run(self, conn: Connection, rows: Sequence[Mapping[str, Any]], *, returns: bool) -> bool:
        driver = conn.connection.driver_connection
        assert driver is not None
        cursor = driver.cursor()
        try:
            if len(rows) == 1:
                cursor.execute(self.sql, self._params(rows[0]))
            else:
                cursor.executemany(self.sql, [self._params(r) for r in rows])
            return returns and cursor.fetchone() is not None
        except conn.dialect.loaded_dbapi.Error as exc:
            raise DBAPIError.instance(
                self.sql, None, exc, conn.dialect.loaded_dbapi.Error, dialect=conn.dialect
            ) from exc
        finally:
            cursor.close()


_DIRECT: dict[tuple[Any, frozenset[str]], _Direct | None] = {}


def _direct(conn: Connection, stmt: Any, table: Table, values: Mapping[str, Any]) -> _Direct | None:
    """The driver-level form of ``stmt`` for these columns on SQLite, else None."""
    if conn.dialect.name != "sqlite":
        return None
    keys = frozenset(values)
    key = (stmt, keys)
    if key in _DIRECT:
        return _DIRECT[key]
    direct = None
    # A column left out whose default SQLAlchemy computes in Python needs its path.
    if not any(
        (c.default is not None or c.onupdate is not None) and c.name not in keys
        for c in table.columns
    ):
        compiled = stmt.compile(dialect=conn.dialect, column_keys=sorted(keys))
        order = tuple(compiled.positiontup or ())
        if compiled.positional and set(order) == keys:
            processors = {k: v for k, v in compiled._bind_processors.items() if k in keys}
            direct = _Direct(compiled.string, order, processors)
    _DIRECT[key] = direct
    return direct


TASKS_CHANNEL = "forgeflow_tasks"


def notify_tasks(conn: Connection) -> None:
    """Tell every worker that a task may have become claimable.

    On PostgreSQL the notification is delivered when the caller's transaction commits,
    so no worker wakes up before the row is visible. SQLite runs one process; its
    in-process wake-up does the same job.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(text(f"NOTIFY {TASKS_CHANNEL}"))
