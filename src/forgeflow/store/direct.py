"""Hot statements on SQLite's own cursor, compiled once by SQLAlchemy.

SQLite's one writer thread is forgeflow's bottleneck, and for a short statement
SQLAlchemy's execute machinery (execution context, parameter and result set-up, cache
key) cost several times what SQLite spent running it. So on SQLite the statements of
the hot paths are compiled once per statement and set of parameters and run on the
driver's cursor, with SQLAlchemy's own bind and result processors (datetimes, JSON,
booleans) and its exception classes. PostgreSQL keeps SQLAlchemy's path: a network round
trip dwarfs the difference there. No library does this; SQLAlchemy's compiled cache is
the part it cannot skip.

The compiled object's ``_bind_processors`` and ``_result_columns`` are internal to
SQLAlchemy: when a release no longer has them, every statement takes SQLAlchemy's path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Table
from sqlalchemy.exc import DBAPIError

Processor = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class Direct:
    sql: str
    order: tuple[str, ...]  # the bind names, in the order of the "?" marks
    defaults: Mapping[str, Any]  # values bound in the statement itself (literals)
    processors: Mapping[str, Processor]
    columns: tuple[str, ...]  # the result columns' keys
    decoders: tuple[Processor | None, ...]

    def _params(self, values: Mapping[str, Any]) -> tuple[Any, ...]:
        p, d = self.processors, self.defaults
        out = []
        for k in self.order:
            v = values[k] if k in values else d[k]
            out.append(p[k](v) if k in p else v)
        return tuple(out)

    def _row(self, raw: Sequence[Any]) -> dict[str, Any]:
        return {
            k: (v if f is None or v is None else f(v))
            for k, f, v in zip(self.columns, self.decoders, raw, strict=True)
        }

    def run(
        self,
        conn: Connection,
        params: Sequence[Mapping[str, Any]],
        *,
        fetch: int | None = 0,
    ) -> tuple[list[dict[str, Any]], int]:
        """Execute (``executemany`` for several parameter sets); returns up to ``fetch``
        rows (None: all) and the row count."""
        driver = conn.connection.driver_connection
        assert driver is not None
        cursor = driver.cursor()
        try:
            if len(params) == 1:
                cursor.execute(self.sql, self._params(params[0]))
            else:
                cursor.executemany(self.sql, [self._params(p) for p in params])
            if fetch is None:
                raw = cursor.fetchall()
            elif fetch == 1:
                one = cursor.fetchone()
                raw = [] if one is None else [one]
            else:
                raw = []
            return [self._row(r) for r in raw], cursor.rowcount
        except conn.dialect.loaded_dbapi.Error as exc:
            raise DBAPIError.instance(
                self.sql, None, exc, conn.dialect.loaded_dbapi.Error, dialect=conn.dialect
            ) from exc
        finally:
            cursor.close()


# Keyed by the statement object: callers pass module constants. A statement built per
# call would only ever miss; the bound keeps such a mistake from growing without end.
_CACHE: dict[tuple[Any, frozenset[str]], Direct | None] = {}
_CACHE_LIMIT = 2048


def direct(
    conn: Connection, stmt: Any, keys: Iterable[str], table: Table | None = None
) -> Direct | None:
    """The driver-level form of ``stmt`` for parameters named ``keys`` on SQLite; None
    elsewhere, or where SQLAlchemy must do more than bind and decode values (Python-side
    column defaults of ``table``, expanding IN lists)."""
    if conn.dialect.name != "sqlite":
        return None
    names = frozenset(keys)
    key = (stmt, names)
    try:
        return _CACHE[key]
    except KeyError:
        pass
    found = None
    if table is None or not any(
        (c.default is not None or c.onupdate is not None) and c.name not in names
        for c in table.columns
    ):
        try:
            found = _compile(conn, stmt, names)
        except (AttributeError, TypeError):  # SQLAlchemy's internals moved
            found = None
    if len(_CACHE) >= _CACHE_LIMIT:
        _CACHE.clear()
    _CACHE[key] = found
    return found


def _compile(conn: Connection, stmt: Any, names: frozenset[str]) -> Direct | None:
    compiled = stmt.compile(dialect=conn.dialect, column_keys=sorted(names))
    if not compiled.positional or "POSTCOMPILE" in compiled.string:
        return None
    order = tuple(compiled.positiontup or ())
    defaults = {}
    for name in order:
        if name in names:
            continue
        bind = compiled.binds[name]
        if bind.callable is not None or (bind.required and bind.value is None):
            return None  # a value SQLAlchemy computes, or one the caller left out
        defaults[name] = bind.effective_value
    columns = tuple(c.keyname for c in compiled._result_columns)
    decoders = tuple(
        c.type._cached_result_processor(conn.dialect, None) for c in compiled._result_columns
    )
    processors = {k: v for k, v in compiled._bind_processors.items() if k in order}
    return Direct(compiled.string, order, defaults, processors, columns, decoders)
