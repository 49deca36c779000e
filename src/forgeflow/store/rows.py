"""Rows become typed records here, and only here.

A record's fields are named as its table's columns (a test holds the two together), so
a row of ``select(table)`` becomes its record by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from sqlalchemy import Connection, RowMapping

from forgeflow.domain.records import Delivery, Repository, Session, Task, TranscriptEntry, Turn

R = TypeVar("R", Task, Repository, Session, Turn, Delivery, TranscriptEntry)


def record(kind: type[R], row: Mapping[str, Any] | RowMapping) -> R:
    return kind(**row)


def first(kind: type[R], conn: Connection, stmt: Any, params: Mapping[str, Any]) -> R | None:
    """The first row of ``stmt`` as a record, or None."""
    row = conn.execute(stmt, dict(params)).mappings().first()
    return None if row is None else kind(**row)


def every(kind: type[R], conn: Connection, stmt: Any, params: Mapping[str, Any]) -> list[R]:
    """Every row of ``stmt`` as a record."""
    return [kind(**row) for row in conn.execute(stmt, dict(params)).mappings()]
