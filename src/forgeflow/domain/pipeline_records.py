"""The typed records of the pipeline tables forgeflow reads as records (see
``domain/records.py``: one frozen record per table, fields named and typed as the
columns of ``store/pipeline_schema.py``, built in ``store/rows.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from forgeflow.domain.records import Record


@dataclass(frozen=True, slots=True)
class PipelineTrigger(Record):
    """What starts runs of a template: a domain event, a schedule, a webhook or a
    person (manual)."""

    trigger_id: str
    template_key: str
    trigger_type: str  # event, schedule, webhook or manual
    event_type: str  # '' when the trigger has none (the unique key needs a value)
    match: dict[str, Any] | None  # an event trigger's filter on the payload
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
    definition: dict[str, Any]  # the definition document (``pipelines/definition.py``)
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
    body: dict[str, Any] | None  # kept (redacted) for a replay; None when refused or large
