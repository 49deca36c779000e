"""What each read-only admin page shows, one frozen record per page.

A template reads a record's fields by name (Jinja reads an attribute as it reads a key);
:func:`forgeflow.web.render.render` hands the fields over as the template's names. Rows
the API also answers stay in the API's JSON form (camelCase, as ``api/schemas.py`` says),
so a page and ``GET /tasks/{taskId}`` show the same thing spelled the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from forgeflow.domain.json import JsonObject
from forgeflow.domain.records import Delivery, TranscriptEntry
from forgeflow.domain.review_record import BotReview
from forgeflow.tasks.egress import Refused
from forgeflow.web.dag import Dag

# A list page's filter fields as submitted ("any" is None), for the form and its links.
Params = dict[str, str | None]


@dataclass(frozen=True, slots=True)
class Paging:
    """Where a list page is: ``prev``/``next`` are the offsets of its neighbours."""

    offset: int
    total: int
    size: int
    prev: int | None
    next: int | None

    @classmethod
    def at(cls, offset: int, total: int, size: int) -> Paging:
        return cls(
            offset=offset,
            total=total,
            size=size,
            prev=max(offset - size, 0) if offset > 0 else None,
            next=offset + size if offset + size < total else None,
        )


@dataclass(frozen=True, slots=True)
class OverviewPage:
    ov: JsonObject  # what GET /overview answers
    running_by_repo: list[tuple[str, list[JsonObject]]]
    tokens_today: int
    sandbox_warning: str | None
    nav: str = "overview"


@dataclass(frozen=True, slots=True)
class TasksPage:
    rows: list[JsonObject]
    page: Paging
    repo_keys: list[str]
    params: Params
    states: list[str]
    nav: str = "tasks"


@dataclass(frozen=True, slots=True)
class TaskPage:
    """One task: what GET /tasks/{taskId} answers, its thread and transcript, and which
    controls apply."""

    task: JsonObject
    terminal: bool
    queue_position: int | None
    turns: list[JsonObject]
    comments: list[JsonObject]
    errors: JsonObject
    audit: list[JsonObject]
    repo: JsonObject | None
    thread: JsonObject | None
    transcript: list[TranscriptEntry]
    egress_refused: list[Refused]
    worktree: str | None
    can_cancel: bool
    can_abort: bool
    can_release: bool
    tokens: int
    stamp_url: str
    review: BotReview | None  # a review task's review as forgeflow recorded it
    # The model the task runs with (its ``--model``, else the configured one; None:
    # the Codex configuration's) and its cost with prices configured (else None).
    model: str | None = None
    cost: str | None = None
    # The repository's setup run when it ran in this task (its log bounded, redacted).
    environment: JsonObject | None = None
    nav: str = "tasks"
    read_only: bool = False  # a Gitea user who may read the repository, not write it


@dataclass(frozen=True, slots=True)
class SessionsPage:
    rows: list[JsonObject]
    page: Paging
    repo_keys: list[str]
    params: Params
    nav: str = "sessions"


@dataclass(frozen=True, slots=True)
class ReposPage:
    rows: list[JsonObject]
    blocked: list[JsonObject]  # tasks blocked on a dirty workspace
    counts: dict[str, dict[str, int]]  # repository → active state → tasks
    roots: list[JsonObject]  # the environments' roots (#26), removed ones too
    nav: str = "repos"


@dataclass(frozen=True, slots=True)
class RepoPage:
    """One repository and its environment (#26): what the operator declared, the
    root of its package list, its last setup run; no secret value."""

    repo: JsonObject
    counts: dict[str, int]  # active state → tasks
    environment: JsonObject  # GET /repos/{repoKey}/environment's answer
    log_tail: str | None  # the end of the last setup's log
    nav: str = "repos"


@dataclass(frozen=True, slots=True)
class DeliveriesPage:
    rows: list[Delivery]
    page: Paging
    repo_keys: list[str]
    params: Params
    statuses: list[str]
    nav: str = "deliveries"


@dataclass(frozen=True, slots=True)
class AuditPage:
    events: list[JsonObject]
    repo_keys: list[str]
    params: Params
    before: int | None  # the page starts before this seq; None: the newest
    older: int | None  # the seq the next page starts before; None: no older page
    error: str | None
    nav: str = "audit"


# -- pipelines (web/pipelines.py, web/pipeline_hooks.py) -------------------------------
# Templates, runs and steps stay in the JSON form GET /api/pipelines answers.


@dataclass(frozen=True, slots=True)
class PipelinesPage:
    rows: list[JsonObject]  # templates with their triggers
    nav: str = "pipelines"


@dataclass(frozen=True, slots=True)
class PipelineTemplatePage:
    template: JsonObject
    definition: JsonObject
    dag: Dag
    warnings: list[str]  # of the stored definition (or its errors, if it no longer loads)
    recent: list[JsonObject]  # the newest runs
    total_runs: int
    manual: bool  # has a manual trigger: the page shows the start form
    nav: str = "pipelines"


@dataclass(frozen=True, slots=True)
class PipelineRunsPage:
    rows: list[JsonObject]
    page: Paging
    keys: list[str]  # template keys, for the filter
    params: Params
    statuses: list[str]
    nav: str = "pipelines"


@dataclass(frozen=True, slots=True)
class PipelineRunPage:
    run: JsonObject  # with its steps
    definition: JsonObject  # redacted
    children: list[JsonObject]
    interrupted: list[str]  # steps a retry would ask to confirm
    dag: Dag
    gates: list[JsonObject]  # steps waiting for an approval
    stamp_url: str
    nav: str = "pipelines"


@dataclass(frozen=True, slots=True)
class PipelineTriggerPage:
    """A webhook trigger's delivery log (what GET .../triggers/{id}/deliveries answers)."""

    trigger: JsonObject
    items: list[JsonObject]
    page: Paging
    params: Params
    statuses: list[str]
    body_kept: int  # bytes of a call's body kept for a replay
    nav: str = "pipelines"
