"""Reviews asked for by pipeline steps (``conversation.reviewPullRequest``): the
pipelines' review port, built in services.py.

A step's request becomes the review task ``@bot review`` makes, by the same door: the
webhook intake's admission (``WebhookIngress.ask_review``), with the same permission
rule applied to whoever started the run (``domain/review_asks.asker``). It is recorded
as a delivery of its own (``pipeline-review:<step key>``), so the same execution asked
again (a crash before the step recorded its task) gets the same task back; a later
attempt first adopts an earlier attempt's task that is still running or succeeded.
The review itself is posted by forgeflow, once, as every review task's
(``tasks/reviews.py``).
"""

from __future__ import annotations

import json

from sqlalchemy import Connection

from forgeflow.domain import modes
from forgeflow.domain import review_asks as ra
from forgeflow.domain.ids import ResourceRef
from forgeflow.domain.intake import Outcome, Recorded, Refused
from forgeflow.domain.pipeline_records import PipelineRun
from forgeflow.domain.records import Refs, Task
from forgeflow.domain.states import SUCCEEDED_STATES, TERMINAL_STATES, TaskState
from forgeflow.gitea import webhook
from forgeflow.gitea.client import GiteaClient
from forgeflow.gitea.models import PullRequest
from forgeflow.store import Store
from forgeflow.store import comments as comment_q
from forgeflow.store import pipelines as runs_q
from forgeflow.store import tasks as task_q
from forgeflow.tasks.intake import WebhookIngress

_MAX_DEPTH = 16  # parent runs looked through for the one that started it all

# The refusals of an admission, as a step reports them (a mention's codes).
_REFUSED = {
    "insufficient_permission": "{who} may not ask for a review of {what}: their Gitea "
    "permission is below FORGEFLOW_TRIGGER_PERMISSION",
    "budget_exceeded": "the repository of {what} is over its token budget",
    "repository_disabled": "the repository of {what} is disabled in forgeflow",
}


def _root(conn: Connection, run_id: str) -> PipelineRun | None:
    """The run that started ``run_id``'s chain of child runs (itself when it has none)."""
    run = runs_q.get_run(conn, run_id)
    for _ in range(_MAX_DEPTH):
        if run is None or run.parent_run_id is None:
            break
        run = runs_q.get_run(conn, run.parent_run_id)
    return run


def _usable(task: Task | None) -> bool:
    """An earlier attempt's task the step takes over: running still, or succeeded."""
    if task is None or task.mode != modes.PR_REVIEW:
        return False
    state = TaskState(task.state)
    return state in SUCCEEDED_STATES or state not in TERMINAL_STATES


class ReviewAsks:
    def __init__(self, store: Store, ingress: WebhookIngress, gitea: GiteaClient | None) -> None:
        self._store = store
        self._ingress = ingress
        self._gitea = gitea

    async def ask(self, ask: ra.ReviewAsk) -> ra.ReviewAsked:
        """The review task of ``ask`` (raises ``GiteaError`` when the pull request cannot
        be read)."""
        earlier = await self._store.read(lambda c: _adoptable(c, ask))
        if earlier is not None:
            return ra.ReviewAsked(earlier, adopted=True)
        run = await self._store.read(lambda c: _root(c, ask.run_id))
        if run is None:
            return ra.ReviewAsked(None, "run_missing", f"run {ask.run_id} does not exist")
        event = run.state.get("event")
        try:
            who = ra.asker(event if isinstance(event, dict) else {}, run.created_by)
        except ValueError as exc:
            return ra.ReviewAsked(None, "invalid_actor", str(exc))
        if self._gitea is None:
            return ra.ReviewAsked(None, "not_configured", "FORGEFLOW_GITEA_URL is not set")
        resource = ask.resource
        pull = await self._gitea.pull(resource.repo.owner, resource.repo.name, resource.number)
        request = _request(ask, who, pull, *await self._repository(resource, pull))
        recorded = {"key": ask.key, "resource": resource.key, "focus": ask.focus, "by": who.name}
        body = json.dumps(recorded, sort_keys=True).encode()
        outcome = await self._ingress.ask_review(
            request, ask.focus, body, operator=who.login is None
        )
        return _answer(outcome, who, resource)

    async def _repository(self, resource: ResourceRef, pull: PullRequest) -> tuple[str, str]:
        """The clone URL and default branch a first task of the repository registers."""
        base = pull.base.repo
        if base is not None and base.clone_url:
            return base.clone_url, base.default_branch or "main"
        assert self._gitea is not None
        found = await self._gitea.repository(resource.repo.owner, resource.repo.name)
        return found.clone_url, found.default_branch or "main"

    async def progress(self, task_id: str) -> ra.ReviewProgress | None:
        """The review task as the step polls it (None: no such task)."""
        return await self._store.read(lambda c: _progress(c, task_id))


def _request(
    ask: ra.ReviewAsk, who: ra.Asker, pull: PullRequest, clone_url: str, branch: str
) -> webhook.CommentEvent:
    """The step's request as the intake reads a review request: no comment, the asker
    as its author, the pull request's refs as Gitea has them now."""
    return webhook.CommentEvent(
        delivery_id=ra.ask_delivery_id(ask.key),
        event_type=ra.ASK_EVENT,
        action="review_requested",
        resource=ask.resource,
        clone_url=clone_url,
        default_branch=branch,
        html_url=pull.html_url,
        comment_id=0,
        comment_body="",
        comment_created_at=None,
        actor_login=who.name,
        refs=Refs(
            base=pull.base.ref or None,
            head=pull.head.ref or None,
            head_sha=pull.head.sha or None,
            head_repo=pull.head.repo.full_name if pull.head.repo else None,
        ),
    )


def _adoptable(conn: Connection, ask: ra.ReviewAsk) -> str | None:
    for key in ask.earlier:
        task_id = ra.ask_task_id(key)
        if _usable(task_q.get(conn, task_id)):
            return task_id
    return None


def _answer(outcome: Outcome, who: ra.Asker, resource: ResourceRef) -> ra.ReviewAsked:
    """The intake's outcome as the step's answer; a refusal keeps a mention's code."""
    if isinstance(outcome, Refused):
        return ra.ReviewAsked(
            None, outcome.code, outcome.message, retryable=outcome.kind == "unavailable"
        )
    if not isinstance(outcome, Recorded):  # no secret, a bad signature: never for a step
        return ra.ReviewAsked(None, "not_admitted", type(outcome).__name__)
    record = outcome.record
    if record.status in ("accepted", "duplicate") and record.task_id is not None:
        return ra.ReviewAsked(record.task_id)
    code = record.reason or record.status
    template = _REFUSED.get(code, "the review of {what} was not admitted ({code})")
    message = template.format(who=who.name, what=resource.key, code=code)
    return ra.ReviewAsked(record.task_id, code, message)


def _progress(conn: Connection, task_id: str) -> ra.ReviewProgress | None:
    # Here, not at the top: tasks.reviews brings the agent's tool server (the mcp SDK),
    # which a process without a scheduler (role web) never loads.
    from forgeflow.tasks.reviews import review_key

    task = task_q.get(conn, task_id)
    if task is None:
        return None
    posted = comment_q.get(conn, review_key(task_id))
    review_id = None
    if posted is not None and posted.status == comment_q.SENT and posted.comment_id:
        review_id = int(posted.comment_id)
    return ra.ReviewProgress(
        task_id=task_id,
        state=task.state,
        terminal=TaskState(task.state) in TERMINAL_STATES,
        succeeded=task.state in SUCCEEDED_STATES,
        review_id=review_id,
        error=task.execution_error or task.reply_error or task.error_code,
        input_tokens=task.input_tokens,
        output_tokens=task.output_tokens,
    )
