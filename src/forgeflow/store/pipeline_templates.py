"""The SQL of pipeline templates (definitions) and their triggers.

Each function takes the caller's ``Connection`` so a unit of work composes several of
them into one transaction. A definition row changes by compare-and-swap on its
``revision``, so two editors of one template cannot overwrite each other unseen.
"""

from __future__ import annotations

import secrets
import uuid
from typing import Unpack

from sqlalchemy import Connection, insert, select, update

from forgeflow.domain.json import JsonObject
from forgeflow.domain.pipeline_records import (
    PipelineTemplate,
    PipelineTrigger,
    TemplateChange,
    TriggerChange,
    WantedTrigger,
)
from forgeflow.store import rows
from forgeflow.store.pipeline_schema import pipeline_definitions as defs
from forgeflow.store.pipeline_schema import pipeline_triggers as triggers
from forgeflow.store.sql import insert_ignore
from forgeflow.store.types import utcnow


def get_definition(conn: Connection, key: str) -> PipelineTemplate | None:
    return rows.first(PipelineTemplate, conn, select(defs).where(defs.c.key == key), {})


def list_definitions(conn: Connection) -> list[PipelineTemplate]:
    return rows.every(PipelineTemplate, conn, select(defs).order_by(defs.c.key), {})


def insert_definition(
    conn: Connection,
    *,
    key: str,
    name: str,
    version: int,
    definition: JsonObject,
    is_enabled: bool,
    built_in: bool = False,
) -> bool:
    """Create a template; False when the key is taken."""
    now = utcnow()
    return insert_ignore(
        conn,
        defs,
        {
            "key": key,
            "name": name,
            "version": version,
            "definition": definition,
            "is_enabled": is_enabled,
            "built_in": built_in,
            "created_at": now,
            "updated_at": now,
            "revision": 1,
        },
    )


def update_definition(
    conn: Connection, key: str, expected_revision: int, **values: Unpack[TemplateChange]
) -> bool:
    result = conn.execute(
        update(defs)
        .where(defs.c.key == key)
        .where(defs.c.revision == expected_revision)
        .values(revision=expected_revision + 1, updated_at=utcnow(), **values)
    )
    return result.rowcount == 1


def lock_definition(conn: Connection, key: str) -> PipelineTemplate | None:
    """Read a template row and hold it for the rest of the transaction (``FOR UPDATE``
    on PostgreSQL; SQLite has one writer anyway): seeders of one template serialise."""
    stmt = select(defs).where(defs.c.key == key).with_for_update()
    return rows.first(PipelineTemplate, conn, stmt, {})


def list_triggers(conn: Connection, template_key: str | None = None) -> list[PipelineTrigger]:
    stmt = select(triggers).order_by(
        triggers.c.template_key, triggers.c.trigger_type, triggers.c.event_type
    )
    if template_key is not None:
        stmt = stmt.where(triggers.c.template_key == template_key)
    return rows.every(PipelineTrigger, conn, stmt, {})


def sync_triggers(conn: Connection, template_key: str, wanted: list[WantedTrigger]) -> None:
    """Make the template's trigger rows match its definition.

    A row that already exists keeps its ``is_enabled`` (the operator's choice) and its
    webhook token; new rows take the definition's ``enabled``; rows no longer declared
    are deleted.
    """
    now = utcnow()
    existing = {(r.trigger_type, r.event_type): r for r in list_triggers(conn, template_key)}
    keep = set()
    for t in wanted:
        ident = (t.trigger_type, t.event_type)
        keep.add(ident)
        values: TriggerChange = {"match": t.match, "schedule": t.schedule, "updated_at": now}
        if ident in existing:
            if existing[ident].schedule != t.schedule:
                values["next_fire_at"] = None  # the trigger clock plans the new one afresh
            update_trigger(conn, existing[ident].trigger_id, **values)
            continue
        insert_trigger(
            conn,
            template_key,
            trigger_type=t.trigger_type,
            event_type=t.event_type,
            match=t.match,
            schedule=t.schedule,
            enabled=t.enabled,
        )
    for ident, row in existing.items():
        if ident not in keep:
            delete_trigger(conn, row.trigger_id)


def insert_trigger(
    conn: Connection,
    template_key: str,
    *,
    trigger_type: str,
    event_type: str,
    match: JsonObject | None,
    schedule: str | None,
    enabled: bool,
) -> None:
    """One trigger row (``event_type`` '' when the trigger has none); a webhook trigger
    gets its token here."""
    now = utcnow()
    conn.execute(
        insert(triggers).values(
            trigger_id=f"trg-{uuid.uuid4().hex}",
            template_key=template_key,
            trigger_type=trigger_type,
            event_type=event_type,
            match=match,
            schedule=schedule,
            webhook_token=secrets.token_urlsafe(24) if trigger_type == "webhook" else None,
            is_enabled=enabled,
            created_at=now,
            updated_at=now,
        )
    )


def update_trigger(conn: Connection, trigger_id: str, **values: Unpack[TriggerChange]) -> None:
    changes: TriggerChange = {"updated_at": utcnow(), **values}
    conn.execute(update(triggers).where(triggers.c.trigger_id == trigger_id).values(**changes))


def delete_trigger(conn: Connection, trigger_id: str) -> None:
    conn.execute(triggers.delete().where(triggers.c.trigger_id == trigger_id))
