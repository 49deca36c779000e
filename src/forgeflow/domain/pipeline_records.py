"""The typed records of the pipeline tables (see ``domain/records.py``: one frozen
record per table, fields named and typed as the columns of ``store/pipeline_schema.py``,
built in ``store/rows.py``), and the typed changes the store applies to runs and steps.

A run's and a step's fields are in their table's column order: the store builds them
from a row's values positionally (a step is built several times per execution).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import NotRequired, TypedDict

from forgeflow.domain.json import JsonObject, JsonValue
from forgeflow.domain.records import Record


@dataclass(frozen=True, slots=True)
class PipelineTrigger(Record):
    """What starts runs of a template: a domain event, a schedule, a webhook or a
    person (manual)."""

    trigger_id: str
    template_key: str
    trigger_type: str  # event, schedule, webhook or manual
    event_type: str  # '' when the trigger has none (the unique key needs a value)
    match: JsonObject | None  # an event trigger's filter on the payload
    schedule: str | None
    webhook_token: str | None
    is_enabled: bool
    last_fired_at: datetime | None
    next_fire_at: datetime | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class ArmedTrigger(PipelineTrigger):
    """A trigger read with its template's switch: a trigger of a disabled template is
    seen (and its skip recorded), not filtered out."""

    template_enabled: bool


@dataclass(frozen=True, slots=True)
class PipelineTemplate(Record):
    """A pipeline template (the ``pipeline_definitions`` table): its definition
    document and its switch; changed by compare-and-swap on ``revision``."""

    key: str
    name: str
    version: int
    definition: JsonObject  # the definition document (``pipelines/definition.py``)
    is_enabled: bool
    built_in: bool
    created_at: datetime
    updated_at: datetime
    revision: int


@dataclass(frozen=True, slots=True)
class HookCall(Record):
    """A call of a pipeline webhook trigger as its log lists it (without the body)."""

    delivery_id: str
    trigger_id: str
    template_key: str
    received_at: datetime
    status: str  # accepted, duplicate or refused
    reason: str | None
    response_code: int
    call_key: str | None  # the caller's identity of the call (a delivery header, …)
    run_id: str | None
    body_bytes: int
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class HookDelivery(HookCall):
    """The whole row of a call (``pipeline_hook_deliveries``): with its kept body."""

    body_digest: str | None  # SHA-256 of an accepted call's signed content
    body: JsonObject | None  # kept (redacted) for a replay; None when refused or large


@dataclass(frozen=True, slots=True)
class PipelineRun(Record):
    """A run of a template (``pipeline_runs``): the definition it started with, its
    state bag and its outcome; changed by compare-and-swap on ``version``."""

    run_id: str
    template_key: str
    definition_version: int
    definition: JsonObject  # the snapshot the run started with (never changes)
    status: str  # a RunStatus
    trigger_type: str
    event_type: str | None
    dedupe_key: str | None
    start_step_id: str
    inputs: JsonObject
    state: JsonObject  # the state bag: inputs, event, and what steps wrote
    cost: float
    input_tokens: int
    output_tokens: int
    error_code: str | None
    error: str | None
    parent_run_id: str | None  # the run whose flow.callPipeline step started this one
    parent_step_id: str | None
    parent_item_index: int | None
    created_by: str
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    version: int


@dataclass(frozen=True, slots=True)
class PipelineStep(Record):
    """A node's row in a run, or one item of a forEach (``item_index`` >= 0)."""

    run_id: str
    step_id: str
    item_index: int  # -1 for a node's own row (kinds.NODE_ROW)
    kind: str  # a StepKind
    body_key: str | None
    status: str  # a StepStatus
    attempt: int
    retry_base: int  # the attempt a retry of the run started from
    next_attempt_at: datetime | None
    item: JsonValue  # a forEach item's element of the list it iterates
    input: JsonValue  # the rendered inputs of the last execution (redacted)
    output: JsonValue
    routes: list[str] | None  # the branches a router chose
    suspend: JsonObject | None  # {"reason": ..., "data": ...} while suspended
    error_code: str | None
    error: str | None
    claimed_by: str | None
    lease_expires_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    suspended_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    version: int


@dataclass(frozen=True, slots=True)
class PlannedStep:
    """What the planner reads of a step row: its key, status, routes and the version a
    compare-and-swap needs (not its inputs and outputs)."""

    run_id: str
    step_id: str
    item_index: int
    status: str
    routes: list[str] | None
    version: int


class NewRun(TypedDict):
    """The columns a new run is inserted with (the store adds the times and version)."""

    run_id: str
    template_key: str
    definition_version: int
    definition: JsonObject
    status: str
    trigger_type: str
    event_type: str | None
    dedupe_key: str | None
    start_step_id: str
    inputs: JsonObject
    state: JsonObject
    created_by: str
    parent_run_id: str | None
    parent_step_id: str | None
    parent_item_index: int | None


class NewStep(TypedDict):
    """The columns a new (pending) step row is inserted with."""

    run_id: str
    step_id: str
    item_index: int
    kind: str
    body_key: str | None
    status: str
    item: NotRequired[JsonValue]


class RunChange(TypedDict, total=False):
    """The columns of a run a compare-and-swap may change (the store bumps the version)."""

    status: str
    state: JsonObject
    cost: float
    input_tokens: int
    output_tokens: int
    error_code: str | None
    error: str | None
    finished_at: datetime | None


class StepChange(TypedDict, total=False):
    """The columns of a step a compare-and-swap may change (the store bumps the version)."""

    status: str
    attempt: int
    retry_base: int
    next_attempt_at: datetime | None
    input: JsonValue
    output: JsonValue
    routes: list[str] | None
    suspend: JsonObject | None
    error_code: str | None
    error: str | None
    claimed_by: str | None
    lease_expires_at: datetime | None
    started_at: datetime | None
    suspended_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class WantedTrigger:
    """A trigger as a template's definition declares it (what its rows are made to match)."""

    trigger_type: str
    event_type: str  # '' when the trigger has none
    match: JsonObject | None
    schedule: str | None
    enabled: bool


class TriggerChange(TypedDict, total=False):
    """The columns of a trigger an update may change."""

    match: JsonObject | None
    schedule: str | None
    is_enabled: bool
    next_fire_at: datetime | None
    updated_at: datetime


class TemplateChange(TypedDict, total=False):
    """The columns of a template a compare-and-swap on its revision may change."""

    name: str
    version: int
    definition: JsonObject
    is_enabled: bool
