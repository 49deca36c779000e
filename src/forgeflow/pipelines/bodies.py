"""Built-in bodies: control flow (trigger, join, condition, gates, callPipeline) and the
bodies that reach the rest of forgeflow through ports (agent, Gitea, workspace).

Bodies are re-entrant: one that suspends with ``until`` is called again then, with
``ctx.resume`` holding the data it suspended with, and picks up from there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from forgeflow.domain import modes
from forgeflow.domain.ids import InvalidName, RepoRef, ResourceKind, ResourceRef, parse_resource_key
from forgeflow.domain.json import JsonObject, JsonValue
from forgeflow.pipelines import state as bag
from forgeflow.pipelines.ports import AgentRequest
from forgeflow.pipelines.registry import (
    Done,
    PipelineBodyRegistry,
    StepContext,
    StepFailed,
    Suspend,
)
from forgeflow.pipelines.steps import APPROVAL
from forgeflow.store.types import utcnow

DEFAULT_POLL_SECONDS = 5.0


def _poll(ctx: StepContext) -> timedelta:
    value = ctx.extras.get("pollSeconds")
    seconds = float(value) if isinstance(value, int | float) and value > 0 else DEFAULT_POLL_SECONDS
    return timedelta(seconds=seconds)


async def trigger(ctx: StepContext) -> Any:
    """``pipeline.trigger``: the start node does no work; its listeners fire next."""
    return None


async def join(ctx: StepContext) -> Any:
    """``pipeline.join``: a join node without a body of its own."""
    return None


def _match(value: Any, case: str) -> bool:
    return isinstance(value, str | int | float) and str(value).strip().lower() == case.lower()


def _contains(value: Any, case: str) -> bool:
    return isinstance(value, str) and case.lower() in value.lower()


async def condition(ctx: StepContext) -> Done:
    """``pipeline.condition``: route by ``extras.switchKey`` (a state path).

    ``cases`` maps a value to a routeKey (a list means value = routeKey). An exact,
    case-insensitive match wins; then the first case the value contains; then
    ``default``; no default is a failure (``no_route``).
    """
    key = ctx.extras.get("switchKey")
    if not isinstance(key, str):
        raise StepFailed("invalid_condition", "extras.switchKey is required", retryable=False)
    raw = ctx.extras.get("cases") or {}
    cases: list[tuple[str, str]]
    if isinstance(raw, Mapping):
        cases = [(str(k), str(v)) for k, v in raw.items()]
    elif isinstance(raw, list):
        cases = [(str(v), str(v)) for v in raw]
    else:
        raise StepFailed(
            "invalid_condition", "extras.cases must be a map or a list", retryable=False
        )
    value = bag.lookup(ctx.context or ctx.state, key)
    values = value if isinstance(value, list) else [value]
    for test in (_match, _contains):
        for v in values:
            for case, route in cases:
                if test(v, case):
                    return Done(output=route, routes=(route,))
    default = ctx.extras.get("default")
    if default is None:
        shown = "missing" if value is bag.MISSING else repr(value)[:200]
        raise StepFailed("no_route", f"{key} is {shown}: no case matches and no default")
    return Done(output=str(default), routes=(str(default),))


async def gate(ctx: StepContext) -> Suspend:
    """``human.gate`` / ``orchestration.awaitApproval``: wait for approve/reject."""
    message = ctx.inputs.get("message") or ctx.inputs.get("prompt")
    return Suspend(APPROVAL, data={"message": message} if message else None)


async def call_pipeline(ctx: StepContext) -> Any:
    """``flow.callPipeline``: start ``extras.templateKey`` as a child run (with this
    step's inputs), wait for it, output its final state."""
    resume = ctx.resume or {}
    child_id = resume.get("childRunId")
    if not child_id:
        template = ctx.extras.get("templateKey")
        if not isinstance(template, str):
            raise StepFailed("invalid_call", "extras.templateKey is required", retryable=False)
        child_id = await ctx.ports.runs.start_child(
            template,
            parent_run_id=ctx.run_id,
            parent_step_id=ctx.step_id,
            parent_item_index=-1 if ctx.item_index is None else ctx.item_index,
            inputs=dict(ctx.inputs),
            dedupe_key=f"child:{ctx.key}",
        )
        return Suspend("awaiting_child_run", utcnow() + _poll(ctx), {"childRunId": child_id})
    child = await ctx.ports.runs.child(str(child_id))
    if child.status == "running":
        return Suspend("awaiting_child_run", utcnow() + _poll(ctx), {"childRunId": child_id})
    if child.status != "succeeded":
        raise StepFailed("child_run_failed", f"child run {child_id} {child.status}: {child.error}")
    return child.state


def resource_of(inputs: Mapping[str, Any]) -> ResourceRef:
    """The issue or pull request a step is about: ``inputs.resource`` (a resourceKey),
    or ``inputs.repo`` ("owner/name") + ``inputs.number`` (+ ``inputs.kind``)."""
    try:
        if isinstance(inputs.get("resource"), str):
            return parse_resource_key(inputs["resource"])
        owner, _, name = str(inputs.get("repo") or "").partition("/")
        number = inputs.get("number")
        if isinstance(number, str) and number.strip().isdigit():
            number = int(number)
        if not isinstance(number, int) or isinstance(number, bool) or number < 1:
            raise InvalidName("inputs.number must be a positive integer")
        kind = ResourceKind(str(inputs.get("kind") or "issue"))
        return ResourceRef(RepoRef(owner, name), kind, number)
    except (InvalidName, ValueError) as exc:
        raise StepFailed(
            "invalid_resource",
            f"{exc}; give inputs.resource or inputs.repo (owner/name) and inputs.number",
            retryable=False,
        ) from None


def _port(ctx: StepContext, name: str) -> Any:
    port = getattr(ctx.ports, name)
    if port is None:
        raise StepFailed(
            "not_configured", f"{name} is not available in this process", retryable=False
        )
    return port


_FENCED = re.compile(r"```(?:json)?\s*(\{.*\})\s*```", re.S)


def reply_data(text: str | None) -> JsonObject:
    """A JSON object the agent answered with (bare or in a ```json fence), else {}."""
    if not text:
        return {}
    candidates = [text.strip(), *(m.group(1) for m in _FENCED.finditer(text))]
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}


async def prompt_agent(ctx: StepContext) -> Any:
    """``conversation.promptAgent``: an agent task for a resource with the rendered
    ``inputs.prompt``; waits until it is terminal. Output: taskId, state, reply, and the
    keys of a JSON object the reply carries."""
    agent = _port(ctx, "agent")
    task_id = (ctx.resume or {}).get("taskId")
    if not task_id:
        prompt = ctx.inputs.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise StepFailed("invalid_prompt", "inputs.prompt is required", retryable=False)
        space = ctx.extras.get("spaceId")
        task_id = await agent.dispatch(
            AgentRequest(
                key=ctx.key,
                run_id=ctx.run_id,
                resource=resource_of(ctx.inputs),
                prompt=prompt,
                space_id=str(ctx.render(space)) if space else None,
                mode=str(ctx.extras["mode"]) if ctx.extras.get("mode") else None,
            )
        )
        return Suspend("awaiting_agent", utcnow() + _poll(ctx), {"taskId": task_id})
    status = await agent.poll(str(task_id))
    if not status.terminal:
        return Suspend("awaiting_agent", utcnow() + _poll(ctx), {"taskId": task_id})
    if not status.succeeded:
        raise StepFailed(
            "agent_task_failed", f"task {task_id} ended {status.state}: {status.error}"
        )
    output = {
        **reply_data(status.reply),
        "taskId": task_id,
        "state": status.state,
        "reply": status.reply,
    }
    return Done(output, input_tokens=status.input_tokens, output_tokens=status.output_tokens)


async def create_space(ctx: StepContext) -> JsonObject:
    """``messaging.createSpace``: the resource's conversation; ``extras.mode`` (chat,
    plan or review; default review) is read here only and recorded with the space:
    every agent step on it runs in that mode (``domain.modes``)."""
    resource = resource_of(ctx.inputs)
    mode = str(ctx.extras.get("mode") or modes.DEFAULT_SPACE_MODE)
    if mode not in modes.MODES:
        raise StepFailed(
            "invalid_mode", "extras.mode must be chat, plan or review", retryable=False
        )
    space_id = await _port(ctx, "agent").create_space(resource, mode, run_id=ctx.run_id)
    return {"spaceId": space_id, "mode": mode, "resourceKey": resource.key}


async def gitea_comment(ctx: StepContext) -> JsonObject:
    """``gitea.comment``: post ``inputs.body`` (or the rendered ``extras.body``) once."""
    resource = resource_of(ctx.inputs)
    body = ctx.inputs.get("body")
    if body is None and ctx.extras.get("body") is not None:
        body = ctx.render(ctx.extras["body"])
    if not isinstance(body, str) or not body.strip():
        raise StepFailed("invalid_body", "inputs.body or extras.body is required", retryable=False)
    item = "" if ctx.item_index is None else f"#{ctx.item_index}"
    marker = f"<!-- forgeflow pipelineStep={ctx.run_id}:{ctx.step_id}{item} -->"
    comment_id = await _port(ctx, "gitea").comment(
        resource.repo, resource.number, body, marker=marker
    )
    return {"commentId": comment_id}


async def gitea_label(ctx: StepContext) -> JsonObject:
    """``gitea.label``: add ``inputs.labels`` (or ``extras.labels``) by name; with
    ``createMissing: true`` the ones the repository lacks are created first."""
    resource = resource_of(ctx.inputs)
    labels = ctx.inputs.get("labels", ctx.extras.get("labels"))
    if isinstance(labels, str):
        labels = [labels]
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels) or not labels:
        raise StepFailed("invalid_labels", "labels must be a list of names", retryable=False)
    create = ctx.inputs.get("createMissing", ctx.extras.get("createMissing", False))
    if not isinstance(create, bool):
        raise StepFailed("invalid_labels", "createMissing must be true or false", retryable=False)
    result = await _port(ctx, "gitea").add_labels(
        resource.repo, resource.number, labels, create_missing=create
    )
    return {"labels": result}


async def repos_cleanup(ctx: StepContext) -> JsonObject:
    """``repos.cleanup``: remove the clean session worktree of a closed resource; with
    ``inputs.sweep: true``, of every resource that is closed on Gitea."""
    if ctx.inputs.get("sweep") is True:
        return await _sweep(ctx)
    resource = resource_of(ctx.inputs)
    result = await ctx.ports.workspace.cleanup(resource)
    return result


async def _sweep(ctx: StepContext) -> JsonObject:
    # Garbage collection of what the merge/close events missed (forgeflow was down, a
    # hook was lost). Open resources keep their worktrees; a dirty one is reported,
    # never touched, and does not fail the sweep.
    gitea = _port(ctx, "gitea")
    removed: list[JsonValue] = []
    kept: list[JsonValue] = []
    for resource in ctx.ports.workspace.session_resources():
        if not await gitea.is_closed(resource.repo, resource.number):
            continue
        try:
            result = await ctx.ports.workspace.cleanup(resource)
        except StepFailed as exc:
            kept.append({"resourceKey": resource.key, "reason": exc.code})
            continue
        if result.get("removed"):
            removed.append(resource.key)
    return {"removed": removed, "kept": kept}


def register_builtins(registry: PipelineBodyRegistry) -> None:
    from forgeflow.pipelines.review_step import review_pull_request
    from forgeflow.pipelines.script import bash_script

    for key, body in (
        ("pipeline.trigger", trigger),
        ("pipeline.join", join),
        ("pipeline.condition", condition),
        ("pipeline.bashScript", bash_script),
        ("human.gate", gate),
        ("orchestration.awaitApproval", gate),
        ("flow.callPipeline", call_pipeline),
        ("conversation.promptAgent", prompt_agent),
        ("conversation.reviewPullRequest", review_pull_request),
        ("messaging.createSpace", create_space),
        ("gitea.comment", gitea_comment),
        ("gitea.label", gitea_label),
        ("repos.cleanup", repos_cleanup),
    ):
        registry.register(key, body)
