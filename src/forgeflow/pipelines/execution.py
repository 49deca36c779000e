"""One execution of a step's body, between its claim and the unit of work that records
its result: render the inputs, call the body under its timeout, and turn whatever the
body raised into a failure with a stable code. Nothing here touches the database.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

from forgeflow.domain.json import JsonObject
from forgeflow.domain.pipeline_records import PipelineRun, PipelineStep
from forgeflow.pipelines.definition import NodeSpec
from forgeflow.pipelines.kinds import NODE_ROW, Code, StepKind
from forgeflow.pipelines.ports import Ports
from forgeflow.pipelines.registry import (
    Body,
    Done,
    PipelineBodyRegistry,
    RunInfo,
    StepContext,
    StepFailed,
    Suspend,
)
from forgeflow.pipelines.render import RenderError, TemplateRenderer
from forgeflow.pipelines.runs import PipelineError


@dataclass(frozen=True, slots=True)
class Failed:
    """An execution that failed; ``retryable`` lets the node's retry policy try again."""

    code: str
    message: str
    retryable: bool


@dataclass(frozen=True, slots=True)
class Call:
    """A body ready to run, with what it will see."""

    body: Body
    ctx: StepContext
    timeout: Any  # the node's extras.timeoutSeconds, None for no limit


def routes_of(value: Any) -> tuple[str, ...]:
    """The branch(es) a router's plain output chooses."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return ()


def _context(run: PipelineRun, node: NodeSpec, step: PipelineStep) -> JsonObject:
    """What the node's input templates may refer to: the state bag, the run, and for a
    forEach item the item itself (under ``extras.itemKey``, ``item`` by default)."""
    context = dict(run.state)
    context["run"] = {
        "id": run.run_id,
        "templateKey": run.template_key,
        "triggerType": run.trigger_type,
        "eventType": run.event_type,
        "parentRunId": run.parent_run_id,
    }
    if step.item_index != NODE_ROW:
        context[str(node.extras.get("itemKey") or "item")] = step.item
        context["itemIndex"] = step.item_index
    return context


def prepare(
    run: PipelineRun,
    node: NodeSpec,
    step: PipelineStep,
    registry: PipelineBodyRegistry,
    ports: Ports,
) -> Call | Failed:
    """The body to call and its context; a failure (not retried) when the inputs do not
    render or no body is registered under the step's key."""
    context = _context(run, node, step)
    renderer = TemplateRenderer(
        allow_unresolved=node.extras.get("allowUnresolvedPlaceholders") is True
    )
    try:
        inputs = renderer.render(node.inputs, context)
    except RenderError as exc:
        return Failed(exc.code, str(exc), retryable=False)
    body = registry.get(step.body_key or "")
    if body is None:
        message = f"no body is registered under {step.body_key!r}"
        return Failed(Code.UNREGISTERED_BODY, message, retryable=False)
    # What the body asked to be given back when it suspended (``Suspend.data``).
    resume = (step.suspend or {}).get("data") if step.suspended_at is not None else None
    run_info = RunInfo(
        run.run_id,
        run.template_key,
        run.trigger_type,
        run.event_type,
        run.parent_run_id,
    )
    ctx = StepContext(
        run=run_info,
        step_id=step.step_id,
        kind=node.kind,
        item_index=None if step.item_index == NODE_ROW else step.item_index,
        attempt=step.attempt,
        inputs=inputs,
        extras=dict(node.extras),
        state=run.state,
        ports=ports,
        item=step.item,
        resume=resume if isinstance(resume, dict) else None,
        renderer=renderer,
        context=context,
    )
    return Call(body, ctx, node.extras.get("timeoutSeconds"))


async def call(c: Call) -> Done | Suspend | Failed:
    """Run the body. Its own refusals keep their code; a timeout or an unexpected
    exception may be retried, a refused pipeline operation is not."""
    try:
        async with asyncio.timeout(float(c.timeout) if c.timeout else None):
            result = await c.body(c.ctx)
    except StepFailed as exc:
        return Failed(exc.code, str(exc), exc.retryable)
    except PipelineError as exc:
        return Failed(exc.code, exc.message, retryable=False)
    except TimeoutError:
        return Failed(Code.STEP_TIMEOUT, f"the body did not finish within {c.timeout}s", True)
    except Exception as exc:
        return Failed(Code.BODY_ERROR, f"{type(exc).__name__}: {exc}", retryable=True)
    if isinstance(result, Suspend):
        return result
    done = result if isinstance(result, Done) else Done(output=result)
    if c.ctx.kind is StepKind.ROUTER and done.routes is None:
        done = dataclasses.replace(done, routes=routes_of(done.output))
    return done
