"""Conversations on a pull request's code lines, as Gitea has them.

Gitea's sources followed:

- a conversation is the code comments of one file and signed line (``Comment.Line``:
  > 0 a new-file line, < 0 an old-file one), whichever review each belongs to;
- ``services/pull/review.go`` ``CreateCodeComment``: a **new single comment** makes a
  review of type Comment with an empty body and submits it (``SubmitReview`` →
  ``notify.PullRequestReview`` → the ``pull_request_review_comment`` hook, a
  PullRequestPayload with ``review`` {type, content} = the review's body, no line
  comment); a **reply** in a conversation joins the review of that conversation
  (``replyReviewID``) and notifies ``CreateIssueComment`` → the
  ``pull_request_comment`` hook, an IssueCommentPayload whose ``comment`` is
  ``ToAPIComment`` of the code comment (no path or line; its ``html_url`` is
  ``…/pulls/N#issuecomment-ID`` for a comment of a submitted review, models/issues
  ``Comment.hashLink``);
- ``routers/api/v1/repo/issue_comment.go``: ``GET /issues/comments/{id}`` answers 204
  for a comment that is not a plain one; ``PATCH`` edits a code comment too
  (``HasContentSupport``);
- Gitea 1.27's ``POST /pulls/{index}/comments/{id}/replies``
  (``CreatePullReviewCommentReplyOptions`` {body}; 201 with the PullReviewComment),
  here only when :attr:`State.reply_api` is set: an older Gitea has no such route (404).

A code comment's diff hunk: ``hunks.py``.
"""

from __future__ import annotations

from starlette.responses import Response

from .api_reviews import CodeComment, comment_json
from .apibase import ApiError, Call, RouteSpec, json_response, not_found
from .convert import JSON, Converter
from .gojson import rfc3339
from .service import Outcome, Service
from .state import User


def api_comment(convert: Converter, c: CodeComment) -> JSON:
    """``ToAPIComment`` of a code comment: what a comment hook carries."""
    issue = convert.state.issues[c.issue_id]
    html = convert.issue_url(issue)
    return {
        "id": c.id,
        "html_url": f"{html}#issuecomment-{c.id}",
        "pull_request_url": html,
        "issue_url": "",
        "user": convert.user(convert.state.users[c.poster_id]),
        "original_author": "",
        "original_author_id": 0,
        "body": c.body,
        "assets": [],
        "created_at": rfc3339(c.created),
        "updated_at": rfc3339(c.created),
    }


def code_comment(call: Call, comment_id: int) -> CodeComment | None:
    """The code comment ``comment_id`` of the call's repository, if it is one."""
    found: CodeComment | None = call.state.review_comments.get(comment_id)
    if found is None:
        return None
    repo, _ = call.repo()
    if call.state.issues[found.issue_id].repo_id != repo.id:
        raise not_found()
    return found


def reply(
    service: Service, parent: CodeComment, doer: User, body: str
) -> tuple[CodeComment, Outcome]:
    """A reply in ``parent``'s conversation: it joins the conversation's review and the
    ``pull_request_comment`` hook fires (notify CreateIssueComment)."""
    state = service.state
    issue = state.issues[parent.issue_id]
    cid = state.next_id("comment")
    made = CodeComment(
        cid,
        parent.review_id,
        issue.id,
        doer.id,
        parent.path,
        parent.line,
        body,
        parent.commit_id,
        state.now(),
        parent.diff_hunk,
    )
    state.review_comments[cid] = made
    payload = service.payloads.issue_comment_payload(
        "created", issue, api_comment(service.convert, made), doer
    )
    repo = state.repos[issue.repo_id]
    return made, Outcome(service.deliverer.prepare(repo, "pull_request_comment", payload, None))


def edit(service: Service, c: CodeComment, doer: User, body: str) -> Outcome:
    """editIssueComment of a code comment: the body changes, the edited hook fires."""
    if body == c.body:
        return Outcome([])
    old, c.body = c.body, body
    issue = service.state.issues[c.issue_id]
    payload = service.payloads.issue_comment_payload(
        "edited", issue, api_comment(service.convert, c), doer, changes_from=old
    )
    repo = service.state.repos[issue.repo_id]
    return Outcome(service.deliverer.prepare(repo, "pull_request_comment", payload, None))


def create_reply(call: Call) -> Response:
    if not call.state.reply_api:
        raise not_found()  # Gitea before 1.27: no such route
    repo, _ = call.repo()
    try:
        issue = call.state.issue_by_index(repo, call.int_param("index"))
    except LookupError:
        raise not_found() from None
    parent = code_comment(call, call.int_param("id"))
    if parent is None or parent.issue_id != issue.id:
        raise not_found()
    body = call.form().get("body")
    if not isinstance(body, str) or not body.strip():
        raise ApiError(422, "[Body]: Required")
    made, outcome = reply(call.service, parent, call.token_user(), body)
    call.deliver(outcome)
    return json_response(comment_json(call.convert, made), 201)


ROUTES: list[RouteSpec] = [
    ("POST", "/repos/{owner}/{repo}/pulls/{index}/comments/{id}/replies", create_reply),
]
