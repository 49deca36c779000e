"""The built-in templates (``builtin/*.yaml``, shipped in the wheel) and their seeding.

Thirteen templates ship with forgeflow, eight of them disabled: a shipped template
starts nothing until an operator turns it on, and the template is that switch, not its
trigger. Every start
reseeds them (:func:`seed_builtins`), and a reseed keeps what the user chose:

- a missing built-in is created (``built_in``) with the triggers its file declares;
  manual and event triggers on, schedule triggers off (a periodic sweep is opted into)
  — except the :data:`FORCED_ON` ones;
- a built-in whose shipped text changed takes the shipped definition under the next
  version (runs keep the snapshot they started with); its enable switch stays the
  user's;
- trigger rows stay the user's: an existing row keeps its ``is_enabled``; a row is only
  inserted for a trigger that is new in the shipped text (so a row the user removed is
  not resurrected), and a trigger the shipped text dropped loses its row;
- :data:`FORCED_ON`: ``pr_merged_cleanup``'s daily schedule is garbage collection, not
  a user's choice — inserted or switched back on at every reseed;
- a template of the same key that a user made (not ``built_in``) is left alone.

Each template is seeded in its own transaction that first takes the template's row
(insert-or-nothing on the primary key, then ``SELECT … FOR UPDATE``): two processes
starting at once on PostgreSQL serialise per template, and the second one finds
nothing left to do.
"""

from __future__ import annotations

from collections.abc import Collection
from functools import partial
from importlib import resources

import structlog
from pydantic import ValidationError
from sqlalchemy import Connection

from forgeflow.domain.json import JsonObject
from forgeflow.domain.pipeline_records import PipelineTemplate, TriggerChange
from forgeflow.pipelines.definition import (
    Loaded,
    PipelineDefinition,
    TriggerSpec,
    load_definition,
    parse_document,
)
from forgeflow.store import Store, audit
from forgeflow.store import pipeline_templates as tpl

log = structlog.get_logger("forgeflow.pipelines")

BUILTIN_DIR = "builtin"
SHIPPED_DISABLED = frozenset(
    {
        "external_pr_welcome",
        "cross_review",
        "ticket_to_pr",
        "pr_triage",
        "pre_merge_gate",
        "release_notes",
        "dep_audit",
        "pr_digest",
    }
)
SHIPPED_ENABLED = frozenset(
    {
        "pr_review",
        "pr_merged_cleanup",
        "task_failed_notice",
        "session_closed_cleanup",
        "budget_threshold_notice",
    }
)
# (template key, trigger type, event type) of triggers switched on at every reseed.
FORCED_ON = frozenset({("pr_merged_cleanup", "schedule", "")})

Ident = tuple[str, str]


def builtin_documents() -> dict[str, str]:
    """The shipped YAML texts by file stem."""
    folder = resources.files("forgeflow.pipelines") / BUILTIN_DIR
    return {
        entry.name.removesuffix(".yaml"): entry.read_text(encoding="utf-8")
        for entry in sorted(folder.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".yaml")
    }


def load_builtins(bodies: Collection[str] | None = None) -> list[Loaded]:
    """Every shipped template, checked (``bodies`` enables the unregistered-body
    warning). A shipped file that does not load is a bug: it raises."""
    out = []
    for stem, text in builtin_documents().items():
        loaded = load_definition(parse_document(text, yaml_format=True), bodies=bodies)
        if loaded.definition.key != stem:
            raise ValueError(f"builtin/{stem}.yaml declares key {loaded.definition.key!r}")
        out.append(loaded)
    return out


def _ident(t: TriggerSpec) -> Ident:
    return (t.type, t.eventType or "")


def _content(d: PipelineDefinition) -> JsonObject:
    """What a reseed compares: the definition without its version and switch."""
    return d.model_copy(update={"version": 1, "enabled": False}).to_json()


def _stored(row: PipelineTemplate) -> PipelineDefinition | None:
    try:
        return PipelineDefinition.model_validate(row.definition)
    except ValidationError:  # written under older rules: replaced by the shipped one
        return None


def _seed_enabled(key: str, t: TriggerSpec) -> bool:
    if (key, *_ident(t)) in FORCED_ON:
        return True
    return t.enabled and t.type != "schedule"


def _reconcile_triggers(
    conn: Connection, key: str, shipped: list[TriggerSpec], previous: list[TriggerSpec] | None
) -> None:
    """Trigger rows after a seed; ``previous`` None means the template is new."""
    rows = {(r.trigger_type, r.event_type): r for r in tpl.list_triggers(conn, key)}
    before = None if previous is None else {_ident(t) for t in previous}
    wanted = {_ident(t): t for t in shipped}
    for ident, t in wanted.items():
        forced = (key, *ident) in FORCED_ON
        row = rows.get(ident)
        if row is None:
            if before is not None and ident in before and not forced:
                continue  # shipped before and its row is gone: the user removed it
            tpl.insert_trigger(
                conn,
                key,
                trigger_type=ident[0],
                event_type=ident[1],
                match=t.match,
                schedule=t.schedule,
                enabled=_seed_enabled(key, t),
            )
            continue
        values: TriggerChange = {}
        if row.match != t.match:
            values["match"] = t.match
        if row.schedule != t.schedule:
            values["schedule"], values["next_fire_at"] = t.schedule, None
        if forced and not row.is_enabled:
            # As switching it on by hand: counted again from now (the clock plans a
            # schedule whose next fire time is unset).
            values["is_enabled"], values["next_fire_at"] = True, None
        if values:
            tpl.update_trigger(conn, row.trigger_id, **values)
    for ident in (before or set()) - wanted.keys():
        if ident in rows:
            tpl.delete_trigger(conn, rows[ident].trigger_id)


def _audit(conn: Connection, key: str, outcome: str, version: int) -> None:
    audit.append(
        conn,
        audit.AuditEvent(
            action="pipeline.template.seed",
            actor="system",
            metadata={"templateKey": key, "outcome": outcome, "version": version},
        ),
    )


def seed_template(conn: Connection, loaded: Loaded) -> str:
    """Seed one built-in (a unit of work): ``created``, ``updated``, ``unchanged`` or
    ``skipped`` (a user's own template holds the key)."""
    d = loaded.definition
    inserted = tpl.insert_definition(
        conn,
        key=d.key,
        name=d.name,
        version=d.version,
        definition=d.to_json(),
        is_enabled=d.enabled,
        built_in=True,
    )
    row = tpl.lock_definition(conn, d.key)
    assert row is not None
    if inserted:
        _reconcile_triggers(conn, d.key, d.triggers, None)
        _audit(conn, d.key, "created", d.version)
        return "created"
    if not row.built_in:
        return "skipped"
    stored = _stored(row)
    previous = stored.triggers if stored is not None else None
    if stored is not None and _content(stored) == _content(d):
        _reconcile_triggers(conn, d.key, d.triggers, previous)  # the forced ones
        return "unchanged"
    version = max(d.version, row.version + 1)
    new = d.model_copy(update={"version": version, "enabled": row.is_enabled})
    # The row is locked: the compare-and-swap on its revision cannot lose.
    updated = tpl.update_definition(
        conn, d.key, row.revision, name=new.name, version=version, definition=new.to_json()
    )
    assert updated
    _reconcile_triggers(conn, d.key, d.triggers, previous)
    _audit(conn, d.key, "updated", version)
    return "updated"


async def seed_builtins(store: Store, bodies: Collection[str] | None = None) -> dict[str, str]:
    """Seed every built-in, one transaction each; returns the outcome per key."""
    outcomes = {}
    for loaded in load_builtins(bodies):
        for warning in loaded.warnings:
            log.warning("pipeline.builtin_warning", key=loaded.definition.key, warning=warning)
        key = loaded.definition.key
        outcomes[key] = await store.write(partial(seed_template, loaded=loaded))
    changed = {k: v for k, v in outcomes.items() if v != "unchanged"}
    if changed:
        log.info("pipeline.builtins_seeded", **changed)
    return outcomes
