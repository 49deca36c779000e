"""JSON views of templates, runs and steps for the API and the command line.

Everything shown passes through :func:`forgeflow.redaction.redact`.
"""

from __future__ import annotations

from forgeflow.domain.json import JsonObject, JsonValue
from forgeflow.domain.pipeline_records import (
    PipelineRun,
    PipelineStep,
    PipelineTemplate,
    PipelineTrigger,
)
from forgeflow.pipelines.kinds import NODE_ROW
from forgeflow.redaction import redact
from forgeflow.store.types import iso


def answer_field(body: JsonObject, *path: str) -> JsonValue:
    """A value inside a control's answer (``run``, ``runId``), None where it has none."""
    value: JsonValue = body
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def trigger_json(t: PipelineTrigger) -> JsonObject:
    return {
        "triggerId": t.trigger_id,
        "type": t.trigger_type,
        "eventType": t.event_type or None,
        "match": t.match,
        "schedule": t.schedule,
        "enabled": t.is_enabled,
        "webhookPath": f"/webhooks/{t.webhook_token}" if t.webhook_token else None,
        "lastFiredAt": iso(t.last_fired_at),
        "nextFireAt": iso(t.next_fire_at),
    }


def template_json(
    row: PipelineTemplate, triggers: list[PipelineTrigger] | None = None, *, full: bool = True
) -> JsonObject:
    out: JsonObject = {
        "key": row.key,
        "name": row.name,
        "version": row.version,
        "enabled": row.is_enabled,
        "builtIn": row.built_in,
        "createdAt": iso(row.created_at),
        "updatedAt": iso(row.updated_at),
    }
    if full:
        out["definition"] = row.definition
    if triggers is not None:
        out["triggers"] = [trigger_json(t) for t in triggers]
    return redact(out)  # type: ignore[no-any-return]


# Columns shown as they are, under their camelCase names, in the order they are shown;
# timestamps (every column ending in ``_at``) as ISO 8601.
_STEP_COLUMNS = (
    "step_id",
    "item_index",
    "kind",
    "body_key",
    "status",
    "attempt",
    "next_attempt_at",
    "item",
    "input",
    "output",
    "routes",
    "suspend",
    "error_code",
    "error",
    "claimed_by",
    "created_at",
    "started_at",
    "suspended_at",
    "finished_at",
    "version",
)
_RUN_COLUMNS = (
    "run_id",
    "template_key",
    "definition_version",
    "status",
    "trigger_type",
    "event_type",
    "dedupe_key",
    "start_step_id",
    "inputs",
    "cost",
    "input_tokens",
    "output_tokens",
    "error_code",
    "error",
    "parent_run_id",
    "parent_step_id",
    "created_by",
    "created_at",
    "updated_at",
    "finished_at",
    "version",
)


def _camel(column: str) -> str:
    head, *rest = column.split("_")
    return head + "".join(word.title() for word in rest)


def _columns(row: PipelineStep | PipelineRun, columns: tuple[str, ...]) -> JsonObject:
    out: JsonObject = {}
    for c in columns:
        value = getattr(row, c)
        out[_camel(c)] = iso(value) if c.endswith("_at") else value
    return out


def step_json(row: PipelineStep) -> JsonObject:
    out = _columns(row, _STEP_COLUMNS)
    if row.item_index == NODE_ROW:
        out["itemIndex"] = None  # a node's own row, not one of its forEach items
    return redact(out)  # type: ignore[no-any-return]


def run_json(
    row: PipelineRun, steps: list[PipelineStep] | None = None, *, state: bool = True
) -> JsonObject:
    out = _columns(row, _RUN_COLUMNS)
    if state:
        out["state"] = row.state
    if steps is not None:
        out["steps"] = [step_json(s) for s in steps]
    return redact(out)  # type: ignore[no-any-return]
