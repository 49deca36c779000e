"""Conversation modes of pipeline spaces (PIPELINES ``messaging.createSpace``).

``extras.mode`` is read on the node that opens the space; every agent step on that
space runs in it and none can widen it. ``chat`` is the mention workflow itself (the
resource's own session, full access, the answer posted on the issue); ``plan`` and
``review`` are drafts: a read-only sandbox, no Gitea MCP server, nothing posted on
Gitea, the agent's final message is the step's result.
"""

from __future__ import annotations

CHAT = "chat"
PLAN = "plan"
REVIEW = "review"
MODES = (CHAT, PLAN, REVIEW)
# A pull request review task (``@bot review``, a review request): not a space's mode
# but a task's. Read-only like a draft, yet its Gitea tools are the readers and
# submit_review, and forgeflow posts the one review it submits (tasks/reviews.py).
PR_REVIEW = "pr_review"
DEFAULT_SPACE_MODE = REVIEW
DRAFT_MODES = frozenset({PLAN, REVIEW})

# What a mode may do: a larger rank is wider. plan and review grant the same.
_RANK = {REVIEW: 0, PLAN: 0, CHAT: 1}


def is_draft(mode: str | None) -> bool:
    """A task in this mode posts nothing on Gitea (NULL is a mention: it posts)."""
    return mode in DRAFT_MODES


def is_read_only(mode: str | None) -> bool:
    """A task in this mode runs in the read-only jail (a draft or a review)."""
    return mode in DRAFT_MODES or mode == PR_REVIEW


def step_mode_error(space_mode: str, step_mode: str | None) -> tuple[str, str] | None:
    """Why an agent step asking for ``step_mode`` may not run on a space opened in
    ``space_mode`` (code, message), or None when it may (it then runs in the space's
    mode). Asking for the same mode, or for none, is fine; anything else is refused,
    a wider mode with its own code, because the space's mode is the boundary."""
    if step_mode is None or step_mode == space_mode:
        return None
    if step_mode not in _RANK:
        return "invalid_mode", f"extras.mode must be one of {', '.join(MODES)}"
    if _RANK[step_mode] > _RANK[space_mode]:
        return (
            "mode_widening",
            f"the space was opened in {space_mode} mode; a step cannot widen it to {step_mode}",
        )
    return (
        "mode_mismatch",
        f"the space was opened in {space_mode} mode, the step asks for {step_mode}: "
        "open a space in that mode with messaging.createSpace",
    )
