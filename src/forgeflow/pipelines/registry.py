"""PipelineBodyRegistry: the work a step does, registered by key at start-up.

A body is an async callable ``body(ctx) -> outcome``. Several steps of different kinds
may share one body. The outcome is

- any JSON value: the step's output (written to the state bag under ``outputKey``);
- :class:`Done`: an output with a router's chosen route(s) and usage to add to the run;
- :class:`Suspend`: the step waits (for an approval, a child run, an agent task); with
  ``until`` the engine calls the body again at that time with ``ctx.resume`` = ``data``;
- an exception: the step failed (:class:`StepFailed` carries a stable code).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from forgeflow.domain.json import JsonObject
from forgeflow.pipelines.kinds import StepKind
from forgeflow.pipelines.render import TemplateRenderer

if TYPE_CHECKING:
    from forgeflow.pipelines.ports import Ports


class StepFailed(Exception):
    """A body's failure with a stable code; ``retryable=False`` skips the retry policy."""

    def __init__(self, code: str, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable


@dataclass(frozen=True, slots=True)
class Done:
    output: Any = None
    routes: tuple[str, ...] | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0


@dataclass(frozen=True, slots=True)
class Suspend:
    reason: str
    until: datetime | None = None
    data: JsonObject | None = None


@dataclass(frozen=True, slots=True)
class RunInfo:
    run_id: str
    template_key: str
    trigger_type: str
    event_type: str | None
    parent_run_id: str | None = None


@dataclass(frozen=True)
class StepContext:
    """What a body sees: its rendered inputs, its extras, a snapshot of the state."""

    run: RunInfo
    step_id: str
    kind: StepKind
    item_index: int | None
    attempt: int
    inputs: Mapping[str, Any]
    extras: Mapping[str, Any]
    state: Mapping[str, Any]
    ports: Ports
    item: Any = None
    resume: Mapping[str, Any] | None = None
    renderer: TemplateRenderer = field(default_factory=TemplateRenderer)
    context: Mapping[str, Any] = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def key(self) -> str:
        """A stable idempotency key of this execution (run, step, item, attempt)."""
        return self.attempt_key(self.attempt)

    def attempt_key(self, attempt: int) -> str:
        """The idempotency key of this step's (and item's) execution ``attempt``."""
        item = "" if self.item_index is None else f"#{self.item_index}"
        return f"{self.run.run_id}:{self.step_id}{item}:{attempt}"

    def render(self, value: Any) -> Any:
        """Render a template the body chose to take from its extras."""
        return self.renderer.render(value, self.context)


Outcome = Any
Body = Callable[[StepContext], Awaitable[Outcome]]


class PipelineBodyRegistry:
    def __init__(self) -> None:
        self._bodies: dict[str, Body] = {}

    def register(self, key: str, body: Body, *, replace: bool = False) -> None:
        if key in self._bodies and not replace:
            raise ValueError(f"body {key!r} is already registered")
        self._bodies[key] = body

    def get(self, key: str) -> Body | None:
        return self._bodies.get(key)

    def keys(self) -> frozenset[str]:
        return frozenset(self._bodies)

    def __contains__(self, key: object) -> bool:
        return key in self._bodies
