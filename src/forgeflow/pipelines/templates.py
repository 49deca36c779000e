"""Templates as units of work: create, replace, enable/disable, and starting a run (by
hand, by a trigger, or by a step of another run).

``PipelineEngine.start`` refuses a disabled template with ``template_disabled``: the
template is the switch, not its trigger, so built-in templates can ship disabled and
start nothing until an operator turns them on.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from forgeflow.domain.json import JsonObject
from forgeflow.domain.pipeline_records import PipelineTemplate, WantedTrigger
from forgeflow.pipelines.definition import Loaded, PipelineDefinition
from forgeflow.pipelines.inputs import InputError, validate_inputs
from forgeflow.pipelines.runs import Parent, PipelineError, Started, create_run
from forgeflow.store import audit
from forgeflow.store import pipeline_templates as tpl
from forgeflow.store import pipelines as q


def _audit(conn: Connection, action: str, key: str, actor: str, **meta: Any) -> None:
    audit.append(
        conn, audit.AuditEvent(action=action, actor=actor, metadata={"templateKey": key, **meta})
    )


def _triggers(d: PipelineDefinition) -> list[WantedTrigger]:
    return [
        WantedTrigger(t.type, t.eventType or "", t.match, t.schedule, t.enabled) for t in d.triggers
    ]


def require(conn: Connection, key: str) -> PipelineTemplate:
    row = tpl.get_definition(conn, key)
    if row is None:
        raise PipelineError("template_not_found", f"no pipeline template {key}", status=404)
    return row


def definition(row: PipelineTemplate) -> PipelineDefinition:
    return PipelineDefinition.model_validate(row.definition)


def create(
    conn: Connection, loaded: Loaded, *, actor: str, built_in: bool = False
) -> PipelineTemplate:
    d = loaded.definition
    if not tpl.insert_definition(
        conn,
        key=d.key,
        name=d.name,
        version=d.version,
        definition=d.to_json(),
        is_enabled=d.enabled,
        built_in=built_in,
    ):
        raise PipelineError("template_exists", f"a pipeline template {d.key} already exists")
    tpl.sync_triggers(conn, d.key, _triggers(d))
    _audit(conn, "pipeline.template.create", d.key, actor, version=d.version)
    return require(conn, d.key)


def replace(
    conn: Connection, key: str, loaded: Loaded, *, actor: str, enabled: bool | None
) -> PipelineTemplate:
    """Replace a template's definition; ``enabled`` None keeps the current switch.

    The version moves forward when the content changed (runs keep their snapshot).
    """
    row = require(conn, key)
    d = loaded.definition
    if d.key != key:
        raise PipelineError(
            "key_mismatch", f"the document's key {d.key!r} is not {key!r}", status=400
        )
    is_enabled = row.is_enabled if enabled is None else enabled
    old = definition(row)
    version = row.version
    if old.model_copy(update={"version": 1, "enabled": True}) != d.model_copy(
        update={"version": 1, "enabled": True}
    ):
        version = max(d.version, row.version + 1)
    d = d.model_copy(update={"version": version, "enabled": is_enabled})
    if not tpl.update_definition(
        conn,
        key,
        row.revision,
        name=d.name,
        version=version,
        definition=d.to_json(),
        is_enabled=is_enabled,
    ):
        raise PipelineError("stale_version", f"template {key} changed concurrently; retry")
    tpl.sync_triggers(conn, key, _triggers(d))
    _audit(conn, "pipeline.template.update", key, actor, version=version)
    return require(conn, key)


def set_enabled(conn: Connection, key: str, enabled: bool, *, actor: str) -> PipelineTemplate:
    row = require(conn, key)
    if row.is_enabled == enabled:
        return row
    d = definition(row).model_copy(update={"enabled": enabled})
    if not tpl.update_definition(
        conn, key, row.revision, is_enabled=enabled, definition=d.to_json()
    ):
        raise PipelineError("stale_version", f"template {key} changed concurrently; retry")
    _audit(conn, f"pipeline.template.{'enable' if enabled else 'disable'}", key, actor)
    return require(conn, key)


def start(
    conn: Connection,
    key: str,
    *,
    trigger_type: str,
    event_type: str | None = None,
    inputs: JsonObject | None = None,
    event: JsonObject | None = None,
    dedupe_key: str | None = None,
    actor: str = "system",
    coerce_text: bool = False,
    parent: Parent | None = None,
) -> Started:
    """Start a run of a template (the unit of work behind ``PipelineEngine.start``).

    A ``dedupe_key`` already used returns that run; a disabled template refuses with
    ``template_disabled``; inputs are checked against the declared ones.
    """
    if dedupe_key is not None:
        existing = q.run_by_dedupe(conn, dedupe_key)
        if existing is not None:
            return Started(existing, False)
    row = require(conn, key)
    if not row.is_enabled:
        raise PipelineError(
            "template_disabled", f"pipeline template {key} is disabled; enable it first"
        )
    d = definition(row)
    try:
        checked = validate_inputs(d.inputs, inputs or {}, coerce_text=coerce_text)
    except InputError as exc:
        raise PipelineError("invalid_inputs", str(exc), status=400, errors=exc.errors) from None
    return create_run(
        conn,
        d,
        trigger_type=trigger_type,
        event_type=event_type,
        inputs=checked,
        event=event,
        dedupe_key=dedupe_key,
        actor=actor,
        parent=parent,
    )


MAX_DEPTH = 8  # runs above a child run, at the most


def start_child(
    conn: Connection, key: str, *, parent: Parent, inputs: JsonObject, dedupe_key: str
) -> str:
    """Start the run a step of ``parent``'s run asks for (``RunsPort.start_child``);
    refused with ``recursive_pipeline`` when the template already runs above that step
    or the chain of runs is :data:`MAX_DEPTH` deep."""
    chain: list[str] = []
    run = q.get_run(conn, parent.run_id)
    while run is not None:
        chain.append(run.template_key)
        run = q.get_run(conn, run.parent_run_id) if run.parent_run_id else None
    if key in chain or len(chain) >= MAX_DEPTH:
        raise PipelineError(
            "recursive_pipeline",
            f"{key} is already running above this step ({' > '.join(chain)})",
        )
    started = start(
        conn,
        key,
        trigger_type="pipeline",
        inputs=inputs,
        dedupe_key=dedupe_key,
        actor=f"pipeline:{parent.run_id}",
        parent=parent,
    )
    return str(started.run.run_id)


def has_manual_trigger(conn: Connection, key: str) -> bool:
    return any(t.trigger_type == "manual" and t.is_enabled for t in tpl.list_triggers(conn, key))


def start_manual(
    conn: Connection,
    key: str,
    *,
    inputs: JsonObject,
    dedupe_key: str | None,
    actor: str,
    coerce_text: bool = False,
) -> Started:
    """Start a run by hand (API, admin pages, command line): only a template with an
    enabled manual trigger may be run so."""
    require(conn, key)
    if not has_manual_trigger(conn, key):
        raise PipelineError(
            "manual_trigger_missing",
            f"template {key} has no enabled manual trigger; it cannot be run by hand",
        )
    return start(
        conn,
        key,
        trigger_type="manual",
        inputs=inputs,
        dedupe_key=dedupe_key,
        actor=actor,
        coerce_text=coerce_text,
    )
