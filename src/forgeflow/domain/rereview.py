"""A later review of the same pull request: what its prompt says about the earlier
review and which diff it carries (pure, no I/O).

The earlier review is forgeflow's own record of what it posted (``review_record.py``),
not Gitea's list of the bot's reviews: it is one read of the store instead of a
request per review and its comments, it holds the comments moved into the summary with
their locations (Gitea only has them inside the body's text), and nobody but forgeflow
wrote it. It is still the agent's text written from the pull request's content, so it
goes into the prompt fenced as untrusted and bounded.

The diff is the one since the earlier review's head (``git diff <old> <head>`` in
forgeflow's mirror) when that head is an ancestor of the head under review; otherwise
(a force-push rewrote the branch, the head did not move, or the diff could not be read)
the pull request's whole diff, and the prompt says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from forgeflow.domain import prompt
from forgeflow.domain.review_record import PostedLine, ReviewRecord

MAX_EARLIER_CHARS = 24_000  # the earlier review's findings in the prompt, at most
MAX_FINDING_CHARS = 2_000  # one finding's text, at most


class Since(StrEnum):
    """How the head under review relates to the earlier review's head."""

    DESCENDS = "descends"  # the earlier head is an ancestor: the diff since is shown
    SAME = "same"  # no commit since the earlier review
    REWRITTEN = "rewritten"  # not an ancestor: a force-push rewrote the branch
    UNREAD = "unread"  # the diff since could not be read here


@dataclass(frozen=True, slots=True)
class Earlier:
    """The last review forgeflow posted on this pull request before this task."""

    task_id: str
    review_id: int
    record: ReviewRecord


ASK = (
    "This is a re-review. In your summary, say first which of the earlier review's "
    "findings the new commits addressed and which still stand (by their location). Do "
    "not repeat an earlier finding as a new line comment unless the new commits changed "
    "it; comment on what is new."
)


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit].rstrip() + " …(cut)"


def _finding(c: PostedLine) -> str:
    return f"- `{c.location}`: " + _clip(c.body, MAX_FINDING_CHARS).replace("\n", "\n  ")


def findings(record: ReviewRecord, *, max_chars: int = MAX_EARLIER_CHARS) -> str:
    """The earlier review's summary, its line comments and the comments moved into its
    summary, each with its location; at most ``max_chars`` (the rest counted)."""
    parts = ["Summary:", _clip(record.shown_summary, max_chars // 3) or "(none)"]
    sections = [("Line comments:", record.comments)]
    if record.moved:
        sections.append(("Comments on lines outside the diff (in the summary):", record.moved))
    used = sum(len(p) + 1 for p in parts)
    left_out = 0
    for title, lines in sections:
        if not lines:
            continue
        parts += ["", title]
        for c in lines:
            text = _finding(c)
            if used + len(text) + 1 > max_chars:
                left_out += 1
                continue
            parts.append(text)
            used += len(text) + 1
    if left_out:
        parts += ["", f"({left_out} more comments not shown)"]
    return "\n".join(parts)


def earlier_parts(earlier: Earlier) -> list[str]:
    """The prompt's paragraphs on the earlier review."""
    r = earlier.record
    return [
        f"forgeflow reviewed this pull request before (review {earlier.review_id}, "
        f"task {earlier.task_id}, at commit {r.commit_id}). Its findings follow: your "
        "earlier review's text, written from the pull request's content.",
        prompt.fence(findings(r), "earlier review"),
    ]


def diff_intro(since: Since, old: str, head: str) -> str:
    """The sentence before the diff a re-review carries."""
    if since is Since.DESCENDS:
        return (
            f"The diff since the earlier review (git diff {old} {head}: only the commits "
            "since it; the whole pull request's diff is available with get_pull_diff, and "
            f"a file's diff since with `git diff {old} {head} -- <path>` in your working "
            "directory; the author's text):"
        )
    why = {
        Since.SAME: f"The head {head} has not moved since the earlier review.",
        Since.REWRITTEN: (
            f"The earlier review's commit {old} is not an ancestor of the head {head}: "
            "the branch was rewritten (force-pushed) since, so there is no diff since it."
        ),
        Since.UNREAD: "The diff since the earlier review could not be read.",
    }[since]
    return (
        f"{why} The whole pull request's diff follows (git diff of the merge base to the "
        "head; the author's text); review all of it:"
    )
