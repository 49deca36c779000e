"""Conversations in a pull request's review threads (issue #24 item 4), as rules
without I/O: which line comments form a thread, which comment of a review asks the
bot, and how a thread is shown to the agent.

Gitea has no thread object: its pages group a pull request's code comments into one
conversation by file and line (``models/issues/review.go`` / the files view group by
``TreePath`` and the signed ``Line``: > 0 a line of the new file, < 0 of the old one),
whichever review each comment belongs to. A reply made in the web UI joins the review
of the conversation's first comment; a comment made through the API (a review of its
own, or Gitea 1.27's reply endpoint) lands on the same path and line, so it joins the
same conversation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from forgeflow.domain.mentions import find_mention
from forgeflow.domain.prompt import fence

# What the prompt shows of a thread at most: its newest comments, each cut.
MAX_THREAD_COMMENTS = 30
MAX_COMMENT_CHARS = 4000
MAX_HUNK_CHARS = 6000


@dataclass(frozen=True, slots=True)
class LineComment:
    """One code comment as Gitea's ``PullReviewComment`` gives it."""

    id: int
    review_id: int
    author: str
    body: str
    path: str
    new_line: int  # ``position``: a line of the new file, 0 when on the old side
    old_line: int  # ``original_position``: a line of the old file, 0 when on the new side
    diff_hunk: str = ""

    @property
    def side(self) -> str:
        return "old" if self.old_line and not self.new_line else "new"

    @property
    def line(self) -> int:
        return self.old_line if self.side == "old" else self.new_line

    @property
    def anchor(self) -> tuple[str, int]:
        """Gitea's conversation key: the path and the signed line."""
        return self.path, (-self.old_line if self.side == "old" else self.new_line)


@dataclass(frozen=True, slots=True)
class Thread:
    """The conversation a line comment belongs to: where it is and what was said,
    oldest first. ``comment_id``: the comment that asked the bot."""

    comment_id: int
    review_id: int  # the review of the conversation's first comment
    path: str
    line: int
    side: str  # "new" or "old"
    diff_hunk: str
    comments: tuple[LineComment, ...]

    @property
    def first_id(self) -> int:
        return self.comments[0].id if self.comments else self.comment_id


def thread_of(comment_id: int, comments: Iterable[LineComment]) -> Thread | None:
    """The thread of ``comment_id`` among a pull request's code comments, or None when
    it is not one of them."""
    every = sorted(comments, key=lambda c: c.id)
    asked = next((c for c in every if c.id == comment_id), None)
    if asked is None:
        return None
    same = tuple(c for c in every if c.anchor == asked.anchor)
    hunk = next((c.diff_hunk for c in same if c.diff_hunk), "")
    return Thread(
        comment_id=comment_id,
        review_id=same[0].review_id,
        path=asked.path,
        line=asked.line,
        side=asked.side,
        diff_hunk=hunk,
        comments=same,
    )


def asking_comments(comments: Iterable[LineComment], author: str, bot: str) -> list[LineComment]:
    """The line comments of just-submitted reviews that mention the bot, oldest first:
    what a review delivery asks, whose payload carries the review's body but not its
    line comments. The reviewer's own comments only; each is a conversation of its own
    and gets its own answer."""
    return [
        c
        for c in sorted(comments, key=lambda c: c.id)
        if c.author.lower() == author.lower() and find_mention(c.body, bot) is not None
    ]


def thread_prompt(thread: Thread) -> str:
    """The prompt's section on the thread: file, line, side, the diff hunk and every
    comment (newest ones, bounded), each in an UNTRUSTED fence."""
    side = "new" if thread.side == "new" else "old"
    # The file's name is in a block of its own, not in the sentence: the pull request's
    # author (or the agent, through a commit) names files, and git allows any byte but
    # NUL in a name (newlines, backticks), so a name inline could speak in our voice.
    lines = [
        "This mention is a line comment in a review thread of the pull request, on "
        f"line {thread.line} ({side} side) of the file named below. Your answer is "
        "posted in that same thread. When the thread asks for a change in the code, "
        "make it in your worktree and commit it, as for any mention: forgeflow pushes "
        "the branch and your answer names the commit.",
        fence(thread.path, "FILE NAME"),
    ]
    if thread.diff_hunk:
        hunk = thread.diff_hunk[-MAX_HUNK_CHARS:]
        lines.append("The diff hunk the thread is on:\n" + fence(hunk, "DIFF HUNK"))
    shown = thread.comments[-MAX_THREAD_COMMENTS:]
    left = len(thread.comments) - len(shown)
    said = "\n\n".join(
        f"{c.author}{' (the mention)' if c.id == thread.comment_id else ''}: "
        f"{c.body[:MAX_COMMENT_CHARS]}"
        for c in shown
    )
    head = "The whole thread, oldest first"
    if left:
        head += f" ({left} older comments left out)"
    lines.append(f"{head}:\n" + fence(said, "THREAD"))
    return "\n\n".join(lines)
