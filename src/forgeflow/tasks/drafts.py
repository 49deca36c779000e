"""Draft tasks: the agent steps of a pipeline space in review or plan mode.

A draft turn runs on its space's own thread (read-only sandbox, no Gitea MCP server)
and posts nothing on Gitea: no receipt, no answer, no failure notice. Its result is
the turn's last agent message, kept on the turn (``turns.last_message``) where
``conversation.promptAgent`` reads it. The task still ends through the one transition
function: ``verifying_reply`` checks that there is a message instead of a comment.
"""

from __future__ import annotations

from forgeflow.agent.port import CommentTool
from forgeflow.domain import modes
from forgeflow.domain.records import Task
from forgeflow.domain.states import TaskState
from forgeflow.store import Store
from forgeflow.store import turns as turn_q
from forgeflow.tasks.moves import TaskMoves

S = TaskState
# A draft turn has no comment tool (its thread has no Gitea MCP server).
NO_TOOL = CommentTool("", "")


def is_draft(task: Task) -> bool:
    return modes.is_draft(task.mode)


async def confirm(store: Store, moves: TaskMoves, task: Task) -> Task:
    """``verifying_reply`` of a draft: the last turn's final message is the answer."""
    turn = await store.read(lambda c: turn_q.last_normal(c, task.task_id))
    text = (turn.last_message if turn else None) or ""
    if not text.strip():
        return await moves.move(
            task,
            S.FAILED_REPLY,
            action="draft.fail",
            error_code="draft_empty",
            fields={"reply_error": "the turn ended without a final message"},
        )
    assert turn is not None
    return await moves.move(
        task,
        S.SUCCEEDED,
        action="draft.record",
        metadata={"mode": task.mode, "turnKey": turn.turn_key, "chars": len(text)},
    )
