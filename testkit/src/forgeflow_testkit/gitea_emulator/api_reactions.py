"""Reactions on issues and comments (routers/api/v1/repo/issue_reaction.go), shaped as
modules/structs/issue_reaction.go's Reaction: ``{user, content, created_at}``."""

from __future__ import annotations

from starlette.responses import Response

from .api_issues import _comment, _issue
from .apibase import ApiError, Call, RouteSpec, empty, json_response, paginate
from .gojson import rfc3339
from .state import Access, Issue, Reaction


def _shape(call: Call, reaction: Reaction) -> dict[str, object]:
    user = call.state.users[reaction.user_id]
    return {
        "user": call.convert.user(user),
        "content": reaction.content,
        "created_at": rfc3339(reaction.created),
    }


def _content(call: Call) -> str:
    # EditReactionOption: {"content": "<reaction>"}
    content = call.form().get("content")
    return content if isinstance(content, str) else ""


def _change(call: Call, issue: Issue, comment_id: int, mode: Access, create: bool) -> Response:
    doer = call.token_user()
    if issue.is_locked and mode < Access.WRITE:
        raise ApiError(403, "no permission to change reaction")
    content = _content(call)
    with call.state.lock:
        mine = [
            r
            for r in call.state.reactions
            if r.issue_id == issue.id
            and r.comment_id == comment_id
            and r.user_id == doer.id
            and r.content == content
        ]
        if not create:  # DeleteIssue(Comment)Reaction: 200, empty, also when absent
            for r in mine:
                call.state.reactions.remove(r)
            return empty(200)
        if content not in call.state.allowed_reactions:
            # ErrForbiddenIssueReaction: "'%s' is not an allowed reaction"
            raise ApiError(403, f"'{content}' is not an allowed reaction")
        if mine:  # ErrReactionAlreadyExist: 200 with the existing one
            return json_response(_shape(call, mine[0]), 200)
        reaction = Reaction(issue.id, comment_id, doer.id, content, call.state.now())
        call.state.reactions.append(reaction)
        return json_response(_shape(call, reaction), 201)


def _listed(call: Call, issue_id: int, comment_id: int) -> Response:
    with call.state.lock:
        found = [
            _shape(call, r)
            for r in call.state.reactions
            if r.issue_id == issue_id and r.comment_id == comment_id
        ]
    page, headers = paginate(call, found)
    return json_response(page, headers=headers)


def list_comment_reactions(call: Call) -> Response:
    _, comment = _comment(call)
    return _listed(call, comment.issue_id, comment.id)


def post_comment_reaction(call: Call) -> Response:
    mode, comment = _comment(call)
    return _change(call, call.state.issues[comment.issue_id], comment.id, mode, True)


def delete_comment_reaction(call: Call) -> Response:
    mode, comment = _comment(call)
    return _change(call, call.state.issues[comment.issue_id], comment.id, mode, False)


def list_issue_reactions(call: Call) -> Response:
    _, _, issue = _issue(call)
    return _listed(call, issue.id, 0)


def post_issue_reaction(call: Call) -> Response:
    _, mode, issue = _issue(call)
    return _change(call, issue, 0, mode, True)


def delete_issue_reaction(call: Call) -> Response:
    _, mode, issue = _issue(call)
    return _change(call, issue, 0, mode, False)


_COMMENT = "/repos/{owner}/{repo}/issues/comments/{id}/reactions"
_ISSUE = "/repos/{owner}/{repo}/issues/{index}/reactions"
ROUTES: list[RouteSpec] = [
    ("GET", _COMMENT, list_comment_reactions),
    ("POST", _COMMENT, post_comment_reaction),
    ("DELETE", _COMMENT, delete_comment_reaction),
    ("GET", _ISSUE, list_issue_reactions),
    ("POST", _ISSUE, post_issue_reaction),
    ("DELETE", _ISSUE, delete_issue_reaction),
]
