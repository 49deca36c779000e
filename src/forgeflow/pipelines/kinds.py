"""The vocabulary of pipelines: step kinds, step and run statuses, error codes.

Pure values shared by the definition model, the planner and the engine.
"""

from __future__ import annotations

from enum import StrEnum


class StepKind(StrEnum):
    """When a step becomes runnable relative to its upstream steps (a node's ``kind``)."""

    TRIGGER = "trigger"
    LISTEN = "listen"
    JOIN = "join"
    ROUTER = "router"
    FOREACH = "forEach"
    TERMINAL = "terminal"


class StepStatus(StrEnum):
    PENDING = "pending"
    RUNNABLE = "runnable"
    RUNNING = "running"
    SUSPENDED = "suspended"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


class RunStatus(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


OPEN_STEP_STATUSES = frozenset(
    {StepStatus.PENDING, StepStatus.RUNNABLE, StepStatus.RUNNING, StepStatus.SUSPENDED}
)
SETTLED_STEP_STATUSES = frozenset(
    {StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.SKIPPED, StepStatus.CANCELLED}
)
TERMINAL_RUN_STATUSES = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED})

# The row of a node itself; forEach items are numbered 0..n-1 beside it.
NODE_ROW = -1

# Default body of the kinds whose body is optional.
DEFAULT_BODIES = {StepKind.TRIGGER: "pipeline.trigger", StepKind.JOIN: "pipeline.join"}

# Where a step's error is kept in the state bag when it continues on failure.
STEP_ERRORS_KEY = "_stepErrors"


class Code:
    """Stable lower-case error codes of steps and runs."""

    UNREGISTERED_BODY = "unregistered_body"
    BODY_ERROR = "body_error"
    STEP_TIMEOUT = "step_timeout"
    UNRESOLVED_PLACEHOLDER = "unresolved_placeholder"
    TEMPLATE_ERROR = "template_error"
    SUSPENDED_TIMEOUT = "suspended_timeout"
    INTERRUPTED_NON_IDEMPOTENT = "interrupted_non_idempotent"
    MAX_STEPS_EXCEEDED = "max_steps_exceeded"
    GATE_REJECTED = "gate_rejected"
    FOREACH_NOT_A_LIST = "foreach_not_a_list"
    REDUCER_ERROR = "reducer_error"
    CANCELLED = "cancelled"
    UPSTREAM_FAILED = "upstream_failed"
    RUN_ENDED = "run_ended"
