"""``conversation.reviewPullRequest``: a review of a pull request as a review task, the
one ``@bot review`` makes (docs/reviews.md): read-only, on a thread of its own in the
pull request's session, and exactly one Gitea review, posted by forgeflow.

The step asks once per execution (its idempotency key names the request, so a body
called again after a crash gets the same task); a later attempt takes over an earlier
attempt's task that still runs or succeeded instead of asking for a second review. It
waits until the task ends and outputs ``taskId``, ``state`` and ``reviewId``.
"""

from __future__ import annotations

from typing import Any

from forgeflow.domain.ids import ResourceKind, ResourceRef
from forgeflow.domain.json import JsonObject
from forgeflow.domain.review_asks import ReviewAsk, bounded_focus
from forgeflow.domain.states import TaskState
from forgeflow.gitea.client import GiteaError
from forgeflow.pipelines.adapters import gitea_step_failed
from forgeflow.pipelines.bodies import _poll, _port, resource_of
from forgeflow.pipelines.registry import Done, StepContext, StepFailed, Suspend
from forgeflow.store.types import utcnow

AWAITING = "awaiting_review"


def _pull_request(inputs: Any) -> ResourceRef:
    """The step's pull request (``inputs.kind`` defaults to pull_request here)."""
    resource = resource_of({"kind": ResourceKind.PULL_REQUEST.value, **dict(inputs)})
    if resource.kind is not ResourceKind.PULL_REQUEST:
        raise StepFailed(
            "invalid_resource", f"{resource.key} is not a pull request", retryable=False
        )
    return resource


async def _ask(ctx: StepContext) -> Suspend:
    earlier = tuple(ctx.attempt_key(a) for a in range(ctx.attempt - 1, 0, -1))
    ask = ReviewAsk(
        key=ctx.key,
        run_id=ctx.run_id,
        resource=_pull_request(ctx.inputs),
        focus=bounded_focus(ctx.inputs.get("focus")),
        earlier=earlier,
    )
    try:
        asked = await _port(ctx, "reviews").ask(ask)
    except GiteaError as exc:
        raise gitea_step_failed(exc) from None
    if asked.code is not None or asked.task_id is None:
        code = asked.code or "review_not_admitted"
        raise StepFailed(code, asked.message, retryable=asked.retryable)
    return Suspend(AWAITING, utcnow() + _poll(ctx), {"taskId": asked.task_id})


async def review_pull_request(ctx: StepContext) -> Suspend | Done:
    """Ask for the review (first call), then wait for its task to end."""
    task_id = (ctx.resume or {}).get("taskId")
    if not task_id:
        return await _ask(ctx)
    progress = await _port(ctx, "reviews").progress(str(task_id))
    if progress is None:
        raise StepFailed("task_missing", f"task {task_id} does not exist", retryable=False)
    if not progress.terminal:
        return Suspend(AWAITING, utcnow() + _poll(ctx), {"taskId": task_id})
    if not progress.succeeded:
        # failed_reply: the review may have reached Gitea; a new task could post another.
        raise StepFailed(
            "review_task_failed",
            f"review task {task_id} ended {progress.state}: {progress.error}",
            retryable=progress.state != TaskState.FAILED_REPLY,
        )
    output: JsonObject = {
        "taskId": str(task_id),
        "state": progress.state,
        "reviewId": progress.review_id,
    }
    return Done(output, input_tokens=progress.input_tokens, output_tokens=progress.output_tokens)
