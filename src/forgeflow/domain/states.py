"""Task states and their transition table.

The table is data; :func:`is_allowed` is the only place that interprets it.
The store's ``transition`` function is the only code that writes a task's state, and
it asks this module first. A delivery that starts nothing (ignored, a duplicate) makes
no task: those are outcomes of the webhook (``webhook_deliveries.status``), not states.
"""

from __future__ import annotations

from enum import StrEnum


class TaskState(StrEnum):
    RECEIVED = "received"
    QUEUED = "queued"
    PREPARING = "preparing"
    RUNNING = "running"
    WAITING_USER = "waiting_user"
    VERIFYING_REPLY = "verifying_reply"
    RETRY_WAIT = "retry_wait"
    BLOCKED_WORKSPACE = "blocked_workspace"
    ABORTING = "aborting"
    SUCCEEDED = "succeeded"
    SUCCEEDED_WITH_REST_FALLBACK = "succeeded_with_rest_fallback"
    FAILED = "failed"
    FAILED_REPLY = "failed_reply"
    CANCELLED = "cancelled"
    ABORTED = "aborted"
    REJECTED = "rejected"


S = TaskState

TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    S.RECEIVED: frozenset({S.QUEUED, S.REJECTED}),
    S.QUEUED: frozenset({S.PREPARING, S.CANCELLED}),
    S.PREPARING: frozenset({S.RUNNING, S.BLOCKED_WORKSPACE, S.RETRY_WAIT, S.FAILED}),
    S.RUNNING: frozenset({S.WAITING_USER, S.VERIFYING_REPLY, S.RETRY_WAIT, S.ABORTING, S.FAILED}),
    S.WAITING_USER: frozenset({S.QUEUED, S.CANCELLED, S.FAILED}),
    S.VERIFYING_REPLY: frozenset({S.SUCCEEDED, S.RETRY_WAIT, S.FAILED_REPLY}),
    S.RETRY_WAIT: frozenset({S.PREPARING, S.RUNNING, S.VERIFYING_REPLY, S.FAILED}),
    S.BLOCKED_WORKSPACE: frozenset({S.QUEUED, S.CANCELLED}),
    S.ABORTING: frozenset({S.ABORTED, S.FAILED}),
    S.SUCCEEDED: frozenset(),
    S.SUCCEEDED_WITH_REST_FALLBACK: frozenset(),
    S.FAILED: frozenset(),
    S.FAILED_REPLY: frozenset(),
    S.CANCELLED: frozenset(),
    S.ABORTED: frozenset(),
    S.REJECTED: frozenset(),
}

TERMINAL_STATES: frozenset[TaskState] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)

# Only these hold the repository's lease: one task at a time works in a repository.
ACTIVE_STATES: frozenset[TaskState] = frozenset({S.PREPARING, S.RUNNING, S.ABORTING})

# Work a worker is doing: the active states and the reply check (which holds no lease).
# Restart recovery moves these on when their worker is gone.
IN_WORK_STATES: frozenset[TaskState] = ACTIVE_STATES | {S.VERIFYING_REPLY}

# Waiting to be claimed: queued, or waiting for its retry time.
CLAIMABLE_STATES: frozenset[TaskState] = frozenset({S.QUEUED, S.RETRY_WAIT})

# Not started yet: an older task of the same resource in one of these goes first, so
# the comments on one issue are answered in order.
WAITING_STATES: frozenset[TaskState] = CLAIMABLE_STATES | {S.BLOCKED_WORKSPACE}

# Tasks that count as ahead of a waiting one in its repository's line.
IN_LINE_STATES: frozenset[TaskState] = CLAIMABLE_STATES | ACTIVE_STATES

# What an operator may cancel: tasks that have not started or wait for someone.
CANCELLABLE_STATES: frozenset[TaskState] = frozenset(
    {S.QUEUED, S.WAITING_USER, S.BLOCKED_WORKSPACE}
)

# Accepted and not ended: the user is owed a receipt comment while a task is in these.
LIVE_STATES: frozenset[TaskState] = frozenset(TRANSITIONS) - TERMINAL_STATES - {S.RECEIVED}

# Ended without an answer from the agent: the user is owed one result comment.
RESULT_STATES: frozenset[TaskState] = frozenset({S.FAILED, S.FAILED_REPLY, S.CANCELLED, S.ABORTED})

# Never accepted (refused for safety or budget): ended straight from ``received``.
NEVER_QUEUED_STATES: frozenset[TaskState] = TRANSITIONS[S.RECEIVED] - {S.QUEUED}

SUCCEEDED_STATES: frozenset[TaskState] = frozenset({S.SUCCEEDED, S.SUCCEEDED_WITH_REST_FALLBACK})
FAILED_STATES: frozenset[TaskState] = frozenset({S.FAILED, S.FAILED_REPLY})

# Reached by the REST fallback: when the agent posted no answer, reply verification
# posts it through the REST API and the task ends here.
_FALLBACK_ENTRY: frozenset[TaskState] = frozenset({S.VERIFYING_REPLY})


class IllegalTransition(Exception):
    """A move that the transition table does not allow."""

    code = "illegal_transition"

    def __init__(self, task_id: str, from_state: str, to_state: str) -> None:
        super().__init__(f"task {task_id}: {from_state} -> {to_state} is not allowed")
        self.task_id = task_id
        self.from_state = from_state
        self.to_state = to_state


def allowed_next(state: TaskState) -> frozenset[TaskState]:
    nxt = TRANSITIONS[state]
    if state in _FALLBACK_ENTRY:
        return nxt | {S.SUCCEEDED_WITH_REST_FALLBACK}
    return nxt


def is_allowed(from_state: str, to_state: str) -> bool:
    try:
        src, dst = TaskState(from_state), TaskState(to_state)
    except ValueError:
        return False
    return dst in allowed_next(src)


def values(states: frozenset[TaskState]) -> tuple[str, ...]:
    """The states as column values, in the table's order (stable SQL text)."""
    return tuple(s.value for s in TaskState if s in states)
