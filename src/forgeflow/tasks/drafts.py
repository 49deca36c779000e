"""Draft tasks: the agent steps of a pipeline space in review or plan mode.

A draft turn runs on its space's own thread (read-only sandbox, no Gitea MCP server)
and posts nothing on Gitea: no receipt, no answer, no failure notice. Its result is
the turn's last agent message, kept on the turn (``turns.last_message``) where
``conversation.promptAgent`` reads it. The task still ends through the one transition
function: its ``verifying_reply`` (``verify.py``) checks that there is a message
instead of a comment.
"""

from __future__ import annotations

from forgeflow.agent.port import CommentTool
from forgeflow.domain import modes
from forgeflow.domain.records import Task

# A draft turn has no comment tool (its thread has no Gitea MCP server).
NO_TOOL = CommentTool("", "")


def is_draft(task: Task) -> bool:
    return modes.is_draft(task.mode)
