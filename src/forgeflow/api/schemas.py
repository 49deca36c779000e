"""Response models of the HTTP API, for ``/openapi.json`` only.

The routes keep building plain dicts (a record's ``json()``); these models are declared
through ``responses=`` so the document tells a client (and schemathesis, which checks
every answer against it) the real shape without FastAPI re-validating or filtering each
answer at run time. Objects stay open (extra keys allowed): a new field is not a
breaking change. Timestamps are ISO-8601 strings; ``None`` where not set yet. The models
of the records (task, turn, repository) are derived from the records themselves.
"""

from __future__ import annotations

import functools
import operator
import types
from datetime import datetime
from typing import TYPE_CHECKING, Any, get_args, get_origin, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model

from forgeflow.domain import records
from forgeflow.domain.records import camel


def _json_type(hint: Any) -> Any:
    """The type of a field in the record's JSON: times become ISO-8601 strings."""
    if hint is datetime:
        return str
    if hint is records.Refs:
        return dict[str, str | bool | None]  # ``Refs.json()``
    if get_origin(hint) is types.UnionType:
        return functools.reduce(operator.or_, (_json_type(arg) for arg in get_args(hint)))
    return hint


def derived(record: type[records.Record]) -> type[BaseModel]:
    """The model of a record's JSON: every field it answers, required, camelCase."""
    hints = get_type_hints(record)
    fields: dict[str, Any] = {camel(n): (_json_type(hints[n]), ...) for n in record.shown()}
    return create_model(record.__name__, __config__=ConfigDict(extra="allow"), **fields)


class ErrorBody(BaseModel):
    """Every error: a stable ``error`` code and a ``message`` for people; some codes add
    fields (``errors`` for definition and input problems, ``taskId``/``state`` for
    ``invalid_state``, ``requestId``/``operator`` for a refused control request)."""

    error: str = Field(description="stable code, e.g. invalid_request, task_not_found")
    message: str
    errors: list[Any] | None = None


class ControlEcho(BaseModel):
    """What every answer to a control request carries besides its own fields."""

    requestId: str | None = None
    operator: str | None = Field(default=None, description="admin:<operator>")
    replayed: bool | None = Field(default=None, description="true on a repeated requestId")


# -- /api/gitea-workflow ------------------------------------------------------------------


if TYPE_CHECKING:  # mypy sees plain models; the real ones are built at import
    Task = BaseModel
    Turn = BaseModel
    Repository = BaseModel
else:
    Task, Turn, Repository = map(derived, (records.Task, records.Turn, records.Repository))


class TaskPage(BaseModel):
    items: list[Task]
    total: int
    limit: int
    offset: int
    nextOffset: int | None


class Comment(BaseModel):
    commentKey: str
    taskId: str
    kind: str
    resourceKey: str
    turnId: str | None
    turnKey: str | None
    commentId: int | None
    bodyHash: str | None
    status: str
    createdAt: str


class TaskErrors(BaseModel):
    errorCode: str | None
    executionError: str | None
    replyError: str | None


class AuditEvent(BaseModel):
    seq: int
    eventId: str
    taskId: str | None
    sessionKey: str | None
    repoKey: str | None
    actor: str
    action: str
    fromState: str | None
    toState: str | None
    stateVersion: int | None
    deliveryId: str | None
    turnId: str | None
    commentId: int | None
    errorCode: str | None
    timestamp: str
    metadata: dict[str, Any]


class TaskDetail(BaseModel):
    task: Task
    terminal: bool
    queuePosition: int | None = Field(description="tasks ahead on its repository while it waits")
    turns: list[Turn]
    comments: list[Comment]
    errors: TaskErrors
    audit: list[AuditEvent]


class AuditPage(BaseModel):
    items: list[AuditEvent]
    nextAfterSeq: int | None


class Control(BaseModel):
    globalPaused: bool
    pauseReason: str | None
    updatedBy: str | None
    updatedAt: str
    version: int


class ControlAnswer(Control, ControlEcho):
    """The global switch after ``pause``/``resume``."""


class RunningTask(BaseModel):
    repoKey: str
    taskId: str
    state: str


class Queue(BaseModel):
    length: int
    oldestQueuedAt: str | None
    oldestQueuedAgeSeconds: float | None


class RepositoryCounts(BaseModel):
    active: int
    disabled: int


class Overview(Control):
    runningSlots: None = Field(description="always null: no global cap, per-repository leases")
    running: list[RunningTask]
    queue: Queue
    tasksByState: dict[str, int]
    repositories: RepositoryCounts
    recentFailures: list[Task]


class RepositoryList(BaseModel):
    items: list[Repository]


# The repository after ``disable``/``enable``.
RepositoryAnswer = create_model("RepositoryAnswer", __base__=(Repository, ControlEcho))


class BudgetAnswer(ControlEcho):
    repoKey: str
    dailyTokens: int | None
    monthlyTokens: int | None


class TaskControlAnswer(ControlEcho):
    taskId: str
    state: str
    changed: bool = Field(description="false when the task already was in the target state")


class Limits(BaseModel):
    day: int | None
    month: int | None


class PeriodUsage(BaseModel):
    inputTokens: int
    outputTokens: int
    cost: float | None = Field(description="null unless token prices are configured")


class SessionUsage(BaseModel):
    sessionKey: str
    inputTokens: int
    outputTokens: int


class RepositoryUsage(BaseModel):
    repoKey: str
    limits: Limits
    day: PeriodUsage
    month: PeriodUsage
    sessions: list[SessionUsage]


class UsageReport(BaseModel):
    items: list[RepositoryUsage]


# -- /api/gitea/webhook -------------------------------------------------------------------


class WebhookReply(BaseModel):
    """``202 {deliveryId, taskId, state}`` for a new mention; ``200 {status, reason?,
    taskId?, state?, originalStatus?}`` for a duplicate, ignored, rejected or accepted
    command delivery (docs/api.md)."""

    deliveryId: str | None = None
    taskId: str | None = None
    state: str | None = None
    status: str | None = None
    reason: str | None = None
    originalStatus: str | None = None


# -- operations ---------------------------------------------------------------------------


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str = Field(description="ready or unavailable")
    database: bool
    migrations: bool | None = None
    sandbox: str | None = Field(default=None, description="bwrap or none")
    warnings: list[str] | None = None


# -- /api/pipelines -----------------------------------------------------------------------


class Trigger(BaseModel):
    triggerId: str
    type: str = Field(description="event, schedule, manual or webhook")
    eventType: str | None
    match: Any = None
    schedule: str | None
    enabled: bool
    webhookPath: str | None = Field(description="/webhooks/<token> of a webhook trigger")
    lastFiredAt: str | None
    nextFireAt: str | None


class TemplateSummary(BaseModel):
    key: str
    name: str
    version: int
    enabled: bool
    builtIn: bool
    createdAt: str
    updatedAt: str
    triggers: list[Trigger]


class TemplateList(BaseModel):
    items: list[TemplateSummary]


class Template(TemplateSummary):
    definition: dict[str, Any]


class TemplateAnswer(BaseModel):
    template: Template
    warnings: list[str]


class TemplateSwitchAnswer(Template, ControlEcho):
    """The template with its triggers after an enable/disable switch."""


class Step(BaseModel):
    stepId: str
    itemIndex: int | None = Field(description="null for the node's own row")
    kind: str
    bodyKey: str | None
    status: str
    attempt: int
    nextAttemptAt: str | None
    item: Any = None
    input: Any = None
    output: Any = None
    routes: Any = None
    suspend: Any = None
    errorCode: str | None
    error: str | None
    claimedBy: str | None
    createdAt: str
    startedAt: str | None
    suspendedAt: str | None
    finishedAt: str | None
    version: int


class RunSummary(BaseModel):
    runId: str
    templateKey: str
    definitionVersion: int
    status: str
    triggerType: str
    eventType: str | None
    dedupeKey: str | None
    startStepId: str
    inputs: Any
    cost: float
    inputTokens: int
    outputTokens: int
    errorCode: str | None
    error: str | None
    parentRunId: str | None
    parentStepId: str | None
    createdBy: str
    createdAt: str
    updatedAt: str
    finishedAt: str | None
    version: int


class Run(RunSummary):
    state: Any = Field(description="the run's state bag")
    steps: list[Step]


class RunPage(BaseModel):
    items: list[RunSummary]
    total: int
    limit: int
    offset: int
    nextOffset: int | None


class RunAnswer(BaseModel):
    run: Run


class RunStarted(ControlEcho):
    run: RunSummary = Field(description="the run with its state bag, without steps")
    created: bool = Field(description="false when this requestId already started it")


class RunCancelled(ControlEcho):
    run: RunSummary


class Decision(ControlEcho):
    runId: str
    stepId: str
    itemIndex: int
    decision: str = Field(description="approved or rejected")
    runStatus: str


# -- ``responses=`` entries ---------------------------------------------------------------

Responses = dict[int | str, dict[str, Any]]


def answer(model: type[BaseModel], description: str) -> dict[str, Any]:
    return {"model": model, "description": description}


def error(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


# What every bearer-authenticated route can answer besides its own outcomes (the
# validation answer is 400, not FastAPI's default 422: see app._openapi).
ADMIN_ERRORS: Responses = {
    400: error("invalid_request: a parameter or body field is missing or malformed"),
    401: error("unauthorized: the bearer token is missing or wrong"),
    413: error("payload_too_large: the body is over api_max_body_bytes"),
    429: error("too_many_attempts: too many wrong tokens from this address; see Retry-After"),
    503: error("store_unavailable: the database is unavailable; retry"),
}

# A path parameter holding a ``/`` no longer names this route: 404 ``not_found``.
UNMATCHED = "not_found when a path parameter does not name a route"
