"""The ``control`` row (global pause) and idempotent control requests (one answer per
``requestId``)."""

from __future__ import annotations

from sqlalchemy import Connection, bindparam, select, update

from forgeflow.domain.bookkeeping import Control, ControlRequest
from forgeflow.domain.json import JsonObject
from forgeflow.store import audit, rows
from forgeflow.store.bookkeeping_schema import control, control_requests
from forgeflow.store.sql import insert_ignore
from forgeflow.store.types import utcnow

_ROW_ID = 1


_GET = select(control).where(control.c.id == bindparam("id"))


def get(conn: Connection) -> Control:
    found = rows.first(Control, conn, _GET, {"id": _ROW_ID})
    if found is None:
        insert_ignore(
            conn,
            control,
            {"id": _ROW_ID, "global_paused": False, "updated_at": utcnow(), "version": 1},
        )
        found = rows.first(Control, conn, _GET, {"id": _ROW_ID})
    assert found is not None
    return found


def set_paused(conn: Connection, paused: bool, actor: str, reason: str | None) -> Control:
    """Pause or resume with compare-and-swap on ``version``; idempotent."""
    row = get(conn)
    if row.global_paused != paused:
        conn.execute(
            update(control)
            .where(control.c.id == _ROW_ID)
            .where(control.c.version == row.version)
            .values(
                global_paused=paused,
                pause_reason=reason if paused else None,
                updated_by=actor,
                updated_at=utcnow(),
                version=row.version + 1,
            )
        )
        audit.append(
            conn,
            audit.AuditEvent(
                action="control.pause" if paused else "control.resume",
                actor=actor,
                metadata={"reason": reason},
            ),
        )
    return get(conn)


_REQUEST = select(control_requests).where(control_requests.c.request_id == bindparam("id"))


def find_request(conn: Connection, request_id: str) -> ControlRequest | None:
    return rows.first(ControlRequest, conn, _REQUEST, {"id": request_id})


def save_request(
    conn: Connection,
    *,
    request_id: str,
    action: str,
    target: str,
    operator: str,
    status_code: int,
    response: JsonObject,
) -> bool:
    return insert_ignore(
        conn,
        control_requests,
        {
            "request_id": request_id,
            "action": action,
            "target": target,
            "operator": operator,
            "status_code": status_code,
            "response": response,
            "created_at": utcnow(),
        },
    )
