"""The records are the one shape of a row: their fields are the table's columns, their
JSON is what the API has always answered, and the OpenAPI models are derived from them."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from forgeflow.api import schemas
from forgeflow.domain import bookkeeping
from forgeflow.domain.pipeline_records import (
    HookDelivery,
    PipelineRun,
    PipelineStep,
    PipelineTemplate,
    PipelineTrigger,
)
from forgeflow.domain.records import (
    Delivery,
    Record,
    Repository,
    Session,
    Task,
    TranscriptEntry,
    Turn,
)
from forgeflow.store.bookkeeping_schema import (
    audit_events,
    comments,
    control,
    control_requests,
    domain_events,
    pushes,
    repo_leases,
    ui_sessions,
    workers,
)
from forgeflow.store.pipeline_schema import (
    pipeline_definitions,
    pipeline_hook_deliveries,
    pipeline_runs,
    pipeline_steps,
    pipeline_triggers,
)
from forgeflow.store.schema import (
    repositories,
    sessions,
    tasks,
    transcript_entries,
    turns,
    webhook_deliveries,
)

TABLES = [
    (Task, tasks),
    (Repository, repositories),
    (Session, sessions),
    (Turn, turns),
    (Delivery, webhook_deliveries),
    (TranscriptEntry, transcript_entries),
    (bookkeeping.AuditEntry, audit_events),
    (bookkeeping.Comment, comments),
    (bookkeeping.Push, pushes),
    (bookkeeping.Control, control),
    (bookkeeping.ControlRequest, control_requests),
    (bookkeeping.Lease, repo_leases),
    (bookkeeping.Worker, workers),
    (bookkeeping.UiSession, ui_sessions),
    (bookkeeping.StoredEvent, domain_events),
    (PipelineTrigger, pipeline_triggers),
    (PipelineTemplate, pipeline_definitions),
    (HookDelivery, pipeline_hook_deliveries),
    (PipelineRun, pipeline_runs),
    (PipelineStep, pipeline_steps),
]


@pytest.mark.parametrize(("record", "table"), TABLES, ids=lambda x: getattr(x, "__name__", ""))
def test_fields_are_the_columns(record: type[Record], table: object) -> None:
    columns = [c.name for c in table.c]  # type: ignore[attr-defined]
    fields = [f.name for f in dataclasses.fields(record)]  # type: ignore[arg-type]
    assert sorted(fields) == sorted(columns)


@pytest.mark.parametrize(
    ("record", "table"), [(PipelineRun, pipeline_runs), (PipelineStep, pipeline_steps)]
)
def test_runs_and_steps_are_in_column_order(record: type[Record], table: object) -> None:
    # The store builds them from a row's values positionally (store/rows.py).
    columns = [c.name for c in table.c]  # type: ignore[attr-defined]
    assert [f.name for f in dataclasses.fields(record)] == columns  # type: ignore[arg-type]


# The JSON keys the API answers (docs/api.md and the acceptance tests pin them).
TASK_KEYS = {
    "taskId", "deliveryKey", "repoKey", "resourceKey", "sessionKey", "commentId", "author",
    "instruction", "state", "attempt", "replyAttempt", "threadId", "turnId", "leaseId",
    "nextRetryAt", "errorCode", "executionError", "replyError", "refs", "retryStep",
    "turnCount", "claimedBy", "inputTokens", "outputTokens", "createdAt", "updatedAt",
    "stateVersion", "mode", "model", "maxTokens", "cachedInputTokens",
}  # fmt: skip
REPOSITORY_KEYS = {
    "repoKey", "instanceId", "owner", "name", "cloneUrl", "workspacePath", "defaultBranch",
    "status", "workerId", "registeredAt", "lastFetchAt", "version",
}  # fmt: skip
SESSION_KEYS = {
    "sessionKey", "resourceKey", "repoKey", "kind", "number", "threadId", "runtime", "mcp",
    "status", "mode", "lastTaskId", "lastTurnId", "createdAt", "updatedAt", "version",
}  # fmt: skip
TURN_KEYS = {
    "turnKey", "turnId", "taskId", "threadId", "kind", "status", "eventSeq", "inputTokens",
    "outputTokens", "lastMessage", "startedAt", "completedAt", "cachedInputTokens",
}  # fmt: skip

AT = datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC)


def _task() -> Task:
    values = {f.name: None for f in dataclasses.fields(Task)}
    values |= {"task_id": "t1", "state": "queued", "created_at": AT, "updated_at": AT}
    return Task(**values)  # type: ignore[arg-type]


def test_task_json_keys_and_times() -> None:
    answer = _task().json()
    assert set(answer) == TASK_KEYS
    assert answer["createdAt"] == "2024-05-01T10:00:00.123456Z"
    assert answer["nextRetryAt"] is None
    assert answer["taskId"] == "t1"


COMMENT_KEYS = {
    "commentKey", "taskId", "kind", "resourceKey", "turnId", "turnKey", "commentId",
    "bodyHash", "status", "createdAt",
}  # fmt: skip
AUDIT_KEYS = {
    "seq", "eventId", "taskId", "sessionKey", "repoKey", "actor", "action", "fromState",
    "toState", "stateVersion", "deliveryId", "turnId", "commentId", "errorCode", "timestamp",
    "metadata",
}  # fmt: skip
CONTROL_KEYS = {"globalPaused", "pauseReason", "updatedBy", "updatedAt", "version"}


@pytest.mark.parametrize(
    ("record", "keys"),
    [
        (Task, TASK_KEYS),
        (Repository, REPOSITORY_KEYS),
        (Session, SESSION_KEYS),
        (Turn, TURN_KEYS),
        (bookkeeping.Comment, COMMENT_KEYS),
        (bookkeeping.Control, CONTROL_KEYS),
        (bookkeeping.AuditEntry, AUDIT_KEYS),
    ],
)
def test_json_keys(record: type[Record], keys: set[str]) -> None:
    from forgeflow.domain.records import camel

    assert {camel(n) for n in record.shown()} == keys


@pytest.mark.parametrize(
    ("model", "keys"),
    [(schemas.Task, TASK_KEYS), (schemas.Repository, REPOSITORY_KEYS), (schemas.Turn, TURN_KEYS)],
)
def test_api_models_are_derived(model: type[schemas.BaseModel], keys: set[str]) -> None:
    doc = model.model_json_schema()
    assert set(doc["properties"]) == keys
    assert set(doc["required"]) == keys
    # Times are answered as strings, and say when they may be missing.
    times = {k for k in keys if k.endswith("At")}
    for key in times:
        assert "string" in str(doc["properties"][key])


def test_records_are_frozen() -> None:
    task = _task()
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.state = "running"  # type: ignore[misc]


def test_the_one_active_task_index_names_the_active_states() -> None:
    # The partial index's SQL is text (the migrations keep a copy); it must name
    # exactly the states that hold a repository's lease.
    from forgeflow.domain.states import ACTIVE_STATES, values
    from forgeflow.store.schema import ACTIVE_STATES_SQL

    named = ", ".join(f"'{v}'" for v in values(ACTIVE_STATES))
    assert f"state IN ({named})" == ACTIVE_STATES_SQL


def test_an_armed_trigger_is_its_row_and_its_templates_switch() -> None:
    from forgeflow.domain.pipeline_records import ArmedTrigger

    fields = [f.name for f in dataclasses.fields(ArmedTrigger)]
    assert fields == [f.name for f in dataclasses.fields(PipelineTrigger)] + ["template_enabled"]


def test_a_hook_call_is_the_log_row_without_its_body() -> None:
    from forgeflow.domain.pipeline_records import HookCall
    from forgeflow.store.hook_deliveries import _SUMMARY

    assert [f.name for f in dataclasses.fields(HookCall)] == [c.name for c in _SUMMARY]
