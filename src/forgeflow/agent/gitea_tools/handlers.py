"""What each of forgeflow's Gitea tools does, over forgeflow's own Gitea client, for one
session: :class:`Session` binds the client to the session's repository and its issue or
pull request, so no handler can address another (no argument names a repository).

A handler returns the text the model reads, or raises :class:`ToolRefused` (the call
was not allowed: reported as ``mcp.refused``) or :class:`ToolFailed` (Gitea said no);
both reach the model as a tool error with a sentence it can act on.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from forgeflow.agent.gitea_tools import args as a
from forgeflow.domain.ids import ResourceKind, ResourceRef, parse_resource_key
from forgeflow.domain.json import JsonObject, JsonValue
from forgeflow.domain.paths import session_branch
from forgeflow.domain.reviews import ReviewDraft
from forgeflow.gitea.client import GiteaClient, GiteaError
from forgeflow.gitea.models import Comment, Issue, Label, PullRequest, Repository

Publish = Callable[[str], Awaitable[tuple[bool, str]]]  # session key -> (ok, what happened)
# The review port (tasks/reviews.py): session key, the agent's draft -> what was posted.
SubmitReview = Callable[[str, ReviewDraft], Awaitable[str]]


class ToolRefused(Exception):
    """The session may not do this (another repository, not the bot's comment, ...)."""


class ToolFailed(Exception):
    """Gitea refused or failed; the message names what and why."""


@dataclass(frozen=True, slots=True)
class Posted:
    comment: Comment
    again: bool  # the same text was posted earlier in this task: found, not posted twice


class Comments(Protocol):
    """The agent's comments as durable records (``tasks/tool_comments.py``, built in
    services.py): an intent before each POST or PATCH and its result after, a retry
    looking in Gitea first; edit_comment's rule reads them. Both raise
    :class:`ToolRefused` (no turn runs in the session; not the agent's comment) or
    ``GiteaError``."""

    async def post(self, session_key: str, body: str) -> Posted: ...

    async def edit(self, session_key: str, comment_id: int, body: str) -> Comment: ...


@dataclass(frozen=True, slots=True)
class Session:
    """One session's view of Gitea: its repository and its issue or pull request."""

    gitea: GiteaClient
    key: str  # the session's key: its resource's, or a pipeline space's on that resource
    resource: ResourceRef
    bot_login: str
    publish: Publish | None
    comments: Comments | None  # without it add_comment and edit_comment are not offered
    reviews: SubmitReview | None = None  # without it submit_review is not offered

    @property
    def owner(self) -> str:
        return self.resource.repo.owner

    @property
    def repo(self) -> str:
        return self.resource.repo.name

    @property
    def is_pull(self) -> bool:
        return self.resource.kind is ResourceKind.PULL_REQUEST

    def number(self, ref: a.IssueRef) -> int:
        return ref.number or self.resource.number


def resource_of(session_key: str) -> ResourceRef:
    """The issue or pull request of a session (a space's key extends its resource's,
    store/sessions.py ``space_key``)."""
    return parse_resource_key(session_key.split(":space-", 1)[0])


def _json(value: JsonValue) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _issue(i: Issue) -> JsonObject:
    return {
        "number": i.number,
        "kind": "pull_request" if i.pull_request is not None else "issue",
        "title": i.title,
        "state": i.state,
        "author": i.user.login,
        "labels": [label.name for label in i.labels],
        "comments": i.comments,
        "html_url": i.html_url,
    }


def _pull(p: PullRequest) -> JsonObject:
    return {
        "number": p.number,
        "kind": "pull_request",
        "title": p.title,
        "body": p.body,
        "state": "merged" if p.merged else p.state,
        "author": p.user.login,
        "labels": [label.name for label in p.labels],
        "head": p.head.ref,
        "head_sha": p.head.sha,
        "head_repository": p.head.repo.full_name if p.head.repo else None,
        "base": p.base.ref,
        "draft": p.draft,
        "mergeable": p.mergeable,
        "html_url": p.html_url,
    }


def _comment(c: Comment) -> JsonObject:
    return {
        "id": c.id,
        "author": c.user.login,
        # As json.dumps(default=str) wrote it.
        "created_at": None if c.created_at is None else str(c.created_at),
        "body": c.body,
    }


async def _gitea(what: str, call: Awaitable[Any]) -> Any:
    try:
        return await call
    except GiteaError as exc:
        if exc.status == 404:
            raise ToolFailed(f"{what}: not found in this repository") from None
        raise ToolFailed(f"{what}: Gitea answered {exc.status or 'nothing'}") from None


gitea_call = _gitea  # for the tools of other modules (review.py)


async def get_issue(s: Session, x: a.IssueRef) -> str:
    n = s.number(x)
    issue: Issue = await _gitea(f"issue #{n}", s.gitea.issue(s.owner, s.repo, n))
    if issue.pull_request is not None:
        pull: PullRequest = await _gitea(f"pull request #{n}", s.gitea.pull(s.owner, s.repo, n))
        return _json(_pull(pull))
    return _json({**_issue(issue), "body": issue.body})


async def list_comments(s: Session, x: a.CommentsArgs) -> str:
    n = s.number(x)
    found = await _gitea(
        f"comments of #{n}",
        s.gitea.comments_page(s.owner, s.repo, n, page=x.page, limit=x.limit),
    )
    return _json(
        {
            "number": n,
            "page": x.page,
            "comments": [_comment(c) for c in found],
            "more": len(found) == x.limit,
        }
    )


def _comments(s: Session) -> Comments:
    assert s.comments is not None, "the comment tools are offered only with their records"
    return s.comments


async def add_comment(s: Session, x: a.AddCommentArgs) -> str:
    n = s.resource.number
    posted: Posted = await _gitea(f"comment on #{n}", _comments(s).post(s.key, x.body))
    c = posted.comment
    # "id" first: the runtime reads the created comment's id from this text (items.py).
    answer: JsonObject = {"id": c.id, "html_url": c.html_url, "number": n}
    if posted.again:
        answer["note"] = "this text was posted already in this task; not posted again"
    return _json(answer)


async def edit_comment(s: Session, x: a.EditCommentArgs) -> str:
    edited: Comment = await _gitea(
        f"comment {x.comment_id}", _comments(s).edit(s.key, x.comment_id, x.body)
    )
    return _json({"id": edited.id, "edited": True})


async def search_issues(s: Session, x: a.SearchArgs) -> str:
    found: list[Issue] = await _gitea(
        "search",
        s.gitea.search_issues(
            s.owner, s.repo, query=x.query, state=x.state, kind=x.kind, page=x.page, limit=x.limit
        ),
    )
    return _json({"page": x.page, "results": [_issue(i) for i in found]})


async def _the_pull(s: Session, n: int) -> PullRequest:
    pull: PullRequest = await _gitea(f"pull request #{n}", s.gitea.pull(s.owner, s.repo, n))
    return pull


def _pull_number(s: Session, x: a.IssueRef) -> int:
    if x.number is None and not s.is_pull:
        raise ToolRefused("this session is an issue, not a pull request: give `number`")
    return s.number(x)


async def list_pull_files(s: Session, x: a.IssueRef) -> str:
    n = _pull_number(s, x)
    files = await _gitea(f"files of #{n}", s.gitea.pull_files(s.owner, s.repo, n, limit=50))
    return _json({"number": n, "files": [f.model_dump() for f in files]})


async def get_pull_diff(s: Session, x: a.DiffArgs) -> str:
    n = _pull_number(s, x)
    diff: bytes = await _gitea(
        f"diff of #{n}", s.gitea.pull_diff(s.owner, s.repo, n, limit=x.max_bytes)
    )
    return _bounded(diff, x.max_bytes, f"the diff of #{n}")


def _bounded(data: bytes, limit: int, what: str) -> str:
    """``data`` as read (at most ``limit`` bytes and one more when it is longer: it is
    never read whole), as text, with a note when it was cut."""
    text = data[:limit].decode("utf-8", errors="replace")
    if len(data) > limit:
        text += f"\n[... {what} is longer than {limit} bytes; cut there]"
    return text


async def _default_branch(s: Session) -> str:
    repo: Repository = await _gitea("the repository", s.gitea.repository(s.owner, s.repo))
    return repo.default_branch or "main"


async def read_file(s: Session, x: a.ReadFileArgs) -> str:
    ref = x.ref or await _default_branch(s)
    data: bytes = await _gitea(
        f"{x.path} at {ref}", s.gitea.raw_file(s.owner, s.repo, x.path, ref, limit=x.max_bytes)
    )
    if b"\0" in data[:8000]:
        size = f"over {x.max_bytes}" if len(data) > x.max_bytes else str(len(data))
        return f"{x.path} at {ref} is a binary file of {size} bytes"
    return _bounded(data, x.max_bytes, x.path)


async def _session_pull(s: Session) -> PullRequest:
    """The pull request this session works on: its own, or the one opened from its
    branch."""
    if s.is_pull:
        return await _the_pull(s, s.resource.number)
    branch = session_branch(s.resource)
    pulls: list[PullRequest] = await _gitea("open pulls", s.gitea.open_pulls(s.owner, s.repo))
    for pull in pulls:
        if pull.head.ref == branch and (
            pull.head.repo is None
            or pull.head.repo.full_name.casefold() == s.resource.repo.full_name.casefold()
        ):
            return pull
    raise ToolRefused(f"no open pull request from this session's branch {branch}")


async def create_pull(s: Session, x: a.CreatePullArgs) -> str:
    if s.is_pull:
        raise ToolRefused("this session is a pull request already; use update_pull")
    head = session_branch(s.resource)
    base = x.base or await _default_branch(s)
    if base == head:
        raise ToolRefused(f"the base may not be the session's own branch {head}")
    pull: PullRequest = await _gitea(
        f"pull request from {head} into {base} (push_branch first; one may exist already)",
        s.gitea.create_pull(s.owner, s.repo, head=head, base=base, title=x.title, body=x.body),
    )
    return _json(_pull(pull))


async def update_pull(s: Session, x: a.UpdatePullArgs) -> str:
    changes = {k: v for k, v in (("title", x.title), ("body", x.body)) if v is not None}
    if not changes:
        raise ToolRefused("give a new title, a new body, or both")
    pull = await _session_pull(s)
    if pull.state != "open" or pull.merged:
        raise ToolRefused(f"pull request #{pull.number} is closed; it cannot be updated")
    edited: PullRequest = await _gitea(
        f"pull request #{pull.number}", s.gitea.edit_pull(s.owner, s.repo, pull.number, changes)
    )
    return _json(_pull(edited))


async def _label_ids(s: Session, names: list[str]) -> dict[str, int]:
    labels: list[Label] = await _gitea("labels", s.gitea.labels(s.owner, s.repo))
    existing = {label.name.casefold(): label for label in labels}
    missing = [n for n in names if n.casefold() not in existing]
    if missing:
        known = ", ".join(sorted(label.name for label in existing.values())) or "none"
        raise ToolRefused(
            f"no label {', '.join(repr(m) for m in missing)} in this repository "
            f"(labels there: {known}); labels are not created by this tool"
        )
    return {existing[n.casefold()].name: existing[n.casefold()].id for n in names}


async def add_labels(s: Session, x: a.LabelsArgs) -> str:
    ids = await _label_ids(s, x.labels)
    n = s.resource.number
    now: list[Label] = await _gitea(
        f"labels of #{n}",
        # By name (Gitea AddIssueLabels takes names or ids), as the repository spells it.
        s.gitea.add_labels(s.owner, s.repo, n, list(ids)),
    )
    return _json({"number": n, "labels": [label.name for label in now]})


async def remove_labels(s: Session, x: a.LabelsArgs) -> str:
    ids = await _label_ids(s, x.labels)
    n = s.resource.number
    for name, label_id in ids.items():
        await _gitea(f"label {name!r} of #{n}", s.gitea.remove_label(s.owner, s.repo, n, label_id))
    return _json({"number": n, "removed": list(ids)})


async def push_branch(s: Session, _x: a.NoArgs) -> str:
    if s.publish is None:
        raise ToolRefused("pushing is not available in this session")
    ok, text = await s.publish(s.key)
    if not ok:
        raise ToolFailed(text)
    return text


async def get_commit_status(s: Session, _x: a.NoArgs) -> str:
    if s.is_pull:
        pull = await _the_pull(s, s.resource.number)
        ref, name = pull.head.sha, f"the head of #{pull.number} ({pull.head.ref})"
    else:
        ref = name = session_branch(s.resource)
    status = await _gitea(
        f"statuses of {name} (push_branch first?)", s.gitea.combined_status(s.owner, s.repo, ref)
    )
    return _json(
        {
            "ref": name,
            "sha": status.sha,
            "state": status.state,
            "statuses": [
                {
                    "context": c.context,
                    "state": c.status,
                    "description": c.description,
                    "target_url": c.target_url,
                }
                for c in status.statuses
            ],
        }
    )
