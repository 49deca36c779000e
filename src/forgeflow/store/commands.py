"""Comment commands (``@bot stop``, ``@bot status``, ``@bot new session``).

They are decided in the acceptance transaction like a mention, audited like operator
controls, and never reach the agent. ``status`` answers with one comment, written here as
an intent with its text and posted by the outbox. Every command's comment also gets a
reaction once it is done (``+1``; ``confused`` for a stop that stopped nothing), an
intent written here too and sent by the outbox after the command's answer (#25).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import Connection, select

from forgeflow.domain.bookkeeping import Comment
from forgeflow.domain.ids import ResourceRef, parse_resource_key
from forgeflow.domain.intake import DeliveryRecord
from forgeflow.domain.json import JsonObject
from forgeflow.domain.mentions import Command
from forgeflow.domain.records import Task
from forgeflow.domain.states import NEVER_QUEUED_STATES, TERMINAL_STATES, TaskState, values
from forgeflow.store import acceptance, audit, comments, deliveries, rows, scheduling, sessions
from forgeflow.store import tasks as task_q
from forgeflow.store.acceptance import Accept
from forgeflow.store.bookkeeping_schema import comments as comments_t
from forgeflow.store.comments import CONFIRMED, PENDING, SENT, SKIPPED
from forgeflow.store.schema import tasks
from forgeflow.store.sql import notify_tasks

# Intents older than this may be posted by whoever comes first (comment_intents.IN_FLIGHT).
_CLAIMABLE_AGE = timedelta(minutes=5)


def latest_task(conn: Connection, resource_key: str) -> Task | None:
    stmt = (
        select(tasks)
        .where(tasks.c.resource_key == resource_key)
        .where(tasks.c.state.not_in(values(NEVER_QUEUED_STATES)))
        .order_by(tasks.c.created_at.desc())
        .limit(1)
    )
    return rows.first(Task, conn, stmt, {})


def run(conn: Connection, a: Accept, command: Command) -> DeliveryRecord:
    opened = acceptance.open_delivery(conn, a, response_code=200)
    if isinstance(opened, DeliveryRecord):
        return opened
    actor = f"gitea:user:{a.author}"
    task = latest_task(conn, a.resource.key)
    if command is Command.STOP:
        outcome = _stop(conn, task, actor)
    elif command is Command.STATUS:
        outcome = _status(conn, a, task)
    else:
        sessions.close(conn, a.resource.session_key, actor=actor)
        outcome = {"sessionKey": a.resource.session_key, "closed": True}
    done = outcome.get("stopped") is not False  # a stop that stopped nothing is no "+1"
    _record_reaction(conn, a, task, "+1" if done else "confused")
    reason = f"command_{command.value.replace(' ', '_')}"
    deliveries.finish(conn, a.delivery_key, reason=reason, task_id=task.task_id if task else None)
    audit.append(
        conn,
        audit.AuditEvent(
            action=f"command.{command.value.replace(' ', '_')}",
            actor=actor,
            task_id=task.task_id if task else None,
            session_key=a.resource.session_key,
            repo_key=a.resource.repo.key,
            delivery_id=a.delivery_id,
            comment_id=a.comment_id,
            metadata=outcome,
        ),
    )
    stopped_in = outcome.get("state")  # what stop left it in; else the task's state
    state = stopped_in if isinstance(stopped_in, str) else (task.state if task else None)
    return DeliveryRecord(
        a.delivery_id, "accepted", 200, task.task_id if task else None, state, reason
    )


def _stop(conn: Connection, task: Task | None, actor: str) -> JsonObject:
    if task is None or TaskState(task.state) in TERMINAL_STATES:
        return {"stopped": False, "why": "nothing is running or waiting"}
    state = TaskState(task.state)
    target = {
        TaskState.QUEUED: TaskState.CANCELLED,
        TaskState.WAITING_USER: TaskState.CANCELLED,
        TaskState.BLOCKED_WORKSPACE: TaskState.CANCELLED,
        TaskState.RUNNING: TaskState.ABORTING,
        TaskState.RETRY_WAIT: TaskState.FAILED,
    }.get(state)
    if target is None:
        return {
            "stopped": False,
            "state": state.value,
            "why": f"a {state.value} task cannot be stopped now; try again shortly",
        }
    row = task_q.transition(
        conn,
        task_q.Transition(
            task.task_id,
            target,
            task.state_version,
            actor=actor,
            action="command.stop",
            error_code="stopped_by_user" if target is TaskState.FAILED else None,
        ),
    )
    notify_tasks(conn)
    return {"stopped": True, "state": row.state}


def _status(conn: Connection, a: Accept, task: Task | None) -> JsonObject:
    task_id = _about(a, task)
    if task is None:
        text = "giteabot: 状态 / status: no task for this issue or pull request yet."
    else:
        text = (
            f"giteabot: 状态 / status: {task.state}"
            f"{_position(conn, task)}; tokens so far: {task.input_tokens} in, "
            f"{task.output_tokens} out."
        )
    comments.record_intent(
        conn,
        comment_key=_key(a, "status"),
        task_id=task_id,
        kind="status",
        resource_key=a.resource.key,
        turn_key=f"{task_id}:0",
        body_hash="",
        body=text,
        age=_CLAIMABLE_AGE,
    )
    return {"statusOf": task_id}


def _position(conn: Connection, task: Task) -> str:
    if task.state != TaskState.QUEUED:
        return ""
    ahead = scheduling.queue_position(conn, task)
    return f", position {ahead + 1} in the repository's queue" if ahead else ", next in line"


def _key(a: Accept, what: str) -> str:
    return f"cmd:{a.resource.repo.key}:{a.comment_id}:{what}"


def _about(a: Accept, task: Task | None) -> str:
    # The task a command's comments are filed under; without one, an id of the delivery.
    if task is not None:
        return task.task_id
    return "gitea-cmd-" + hashlib.sha256(a.delivery_key.encode()).hexdigest()[:24]


# -- the reaction that says a command was done ----------------------------------------
# One row per command, ``cmd:<repo>:<comment>:reaction`` (kind "reaction", body the
# reaction's content): PENDING until the outbox sent it (SENT) or Gitea refused it
# (SKIPPED). Gitea answers an existing reaction with 200, so a resend after a crash
# between the reaction and its record adds nothing.
REACTION = "reaction"
_REACTIONS_OWED = (
    select(comments_t)
    .where(comments_t.c.kind == REACTION)
    .where(comments_t.c.status == PENDING)
    .order_by(comments_t.c.created_at)
    .limit(100)
)


@dataclass(frozen=True, slots=True)
class CommandReaction:
    """A command's reaction owed: on ``comment_id`` (None: the issue's own body)."""

    key: str
    content: str
    resource: ResourceRef
    comment_id: int | None


def _record_reaction(conn: Connection, a: Accept, task: Task | None, content: str) -> None:
    comments.record_intent(
        conn,
        comment_key=_key(a, REACTION),
        task_id=_about(a, task),
        kind=REACTION,
        resource_key=a.resource.key,
        turn_key=None,
        body_hash="",
        body=content,
    )


def reactions_owed(conn: Connection) -> list[CommandReaction]:
    """The reactions to send: those of commands whose answer, if they have one, is
    posted (a ``status`` gets its reaction after its answer, not before)."""
    owed = rows.every(Comment, conn, _REACTIONS_OWED, {})
    if not owed:
        return []
    answers = [r.comment_key.removesuffix(REACTION) + "status" for r in owed]
    unposted = {
        row.comment_key
        for row in rows.every(
            Comment, conn, select(comments_t).where(comments_t.c.comment_key.in_(answers)), {}
        )
        if row.status not in (SENT, CONFIRMED)
    }
    return [
        _reaction(r)
        for r in owed
        if r.comment_key.removesuffix(REACTION) + "status" not in unposted
    ]


def _reaction(row: Comment) -> CommandReaction:
    target = row.comment_key.removesuffix(":" + REACTION).rpartition(":")[2]
    return CommandReaction(
        key=row.comment_key,
        content=row.body or "+1",
        resource=parse_resource_key(row.resource_key),
        comment_id=int(target) if target.isdigit() else None,
    )


def reacted(conn: Connection, reaction: CommandReaction, *, refused: bool) -> None:
    """Record the reaction sent, or refused by Gitea (then it is not tried again)."""
    comments.record_result(
        conn,
        reaction.key,
        status=SKIPPED if refused else SENT,
        comment_id=reaction.comment_id,
        how="reaction_refused" if refused else "reacted",
    )
