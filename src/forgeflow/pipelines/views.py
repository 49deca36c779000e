"""JSON views of templates, runs and steps for the API and the command line.

Everything shown passes through :func:`forgeflow.redaction.redact`.
"""

from __future__ import annotations

from typing import Any

from forgeflow.pipelines.kinds import NODE_ROW
from forgeflow.redaction import redact
from forgeflow.store.pipelines import Row
from forgeflow.store.types import iso


def trigger_json(row: Row) -> dict[str, Any]:
    return {
        "triggerId": row["trigger_id"],
        "type": row["trigger_type"],
        "eventType": row["event_type"] or None,
        "match": row["match"],
        "schedule": row["schedule"],
        "enabled": row["is_enabled"],
        "webhookPath": f"/webhooks/{row['webhook_token']}" if row["webhook_token"] else None,
        "lastFiredAt": iso(row["last_fired_at"]),
        "nextFireAt": iso(row["next_fire_at"]),
    }


def template_json(
    row: Row, triggers: list[Row] | None = None, *, full: bool = True
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "key": row["key"],
        "name": row["name"],
        "version": row["version"],
        "enabled": row["is_enabled"],
        "builtIn": row["built_in"],
        "createdAt": iso(row["created_at"]),
        "updatedAt": iso(row["updated_at"]),
    }
    if full:
        out["definition"] = row["definition"]
    if triggers is not None:
        out["triggers"] = [trigger_json(t) for t in triggers]
    return redact(out)  # type: ignore[no-any-return]


def step_json(row: Row) -> dict[str, Any]:
    return redact(  # type: ignore[no-any-return]
        {
            "stepId": row["step_id"],
            "itemIndex": None if row["item_index"] == NODE_ROW else row["item_index"],
            "kind": row["kind"],
            "bodyKey": row["body_key"],
            "status": row["status"],
            "attempt": row["attempt"],
            "nextAttemptAt": iso(row["next_attempt_at"]),
            "item": row["item"],
            "input": row["input"],
            "output": row["output"],
            "routes": row["routes"],
            "suspend": row["suspend"],
            "errorCode": row["error_code"],
            "error": row["error"],
            "claimedBy": row["claimed_by"],
            "createdAt": iso(row["created_at"]),
            "startedAt": iso(row["started_at"]),
            "suspendedAt": iso(row["suspended_at"]),
            "finishedAt": iso(row["finished_at"]),
            "version": row["version"],
        }
    )


def run_json(row: Row, steps: list[Row] | None = None, *, state: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "runId": row["run_id"],
        "templateKey": row["template_key"],
        "definitionVersion": row["definition_version"],
        "status": row["status"],
        "triggerType": row["trigger_type"],
        "eventType": row["event_type"],
        "dedupeKey": row["dedupe_key"],
        "startStepId": row["start_step_id"],
        "inputs": row["inputs"],
        "cost": row["cost"],
        "inputTokens": row["input_tokens"],
        "outputTokens": row["output_tokens"],
        "errorCode": row["error_code"],
        "error": row["error"],
        "parentRunId": row["parent_run_id"],
        "parentStepId": row["parent_step_id"],
        "createdBy": row["created_by"],
        "createdAt": iso(row["created_at"]),
        "updatedAt": iso(row["updated_at"]),
        "finishedAt": iso(row["finished_at"]),
        "version": row["version"],
    }
    if state:
        out["state"] = row["state"]
    if steps is not None:
        out["steps"] = [step_json(s) for s in steps]
    return redact(out)  # type: ignore[no-any-return]
