"""REST routes of issues, pull requests, comments and issue labels (routers/api/v1/repo)."""

from __future__ import annotations

from starlette.responses import Response

from .api_reviews import CodeComment
from .api_threads import api_comment, code_comment, edit
from .apibase import ApiError, Call, RouteSpec, empty, json_response, not_found, paginate
from .gitrepo import GitRepo
from .gojson import parse_rfc3339
from .state import Access, Comment, Issue, NotFound, Repo, User


def _issue(call: Call) -> tuple[Repo, Access, Issue]:
    repo, mode = call.repo()
    try:
        issue = call.state.issue_by_index(repo, call.int_param("index"))
    except NotFound:
        raise not_found() from None
    return repo, mode, issue


def _pull(call: Call) -> tuple[Repo, Access, Issue]:
    repo, mode, issue = _issue(call)
    if not issue.is_pull:  # GetPullRequestByIndex fails for a plain issue
        raise not_found()
    return repo, mode, issue


def _writer(mode: Access, doer: User, what: str = "issues") -> None:
    if mode < Access.WRITE:
        raise ApiError(403, f"{doer.login} has no write access to {what}")


# -- issues ---------------------------------------------------------------------------


def list_issues(call: Call) -> Response:
    """Gitea ListIssues: state open|closed|all (default open), type issues|pulls,
    labels by name, q keywords (in title or body, as the issue indexer matches them);
    newest first."""
    repo, _ = call.repo()
    state = call.query.get("state", "open")
    kind = call.query.get("type", "")
    wanted = {n for n in call.query.get("labels", "").split(",") if n}
    words = call.query.get("q", "").lower().split()
    issues = []
    for issue in reversed(call.state.repo_issues(repo)):
        if state != "all" and issue.state != state:
            continue
        if (kind == "issues" and issue.is_pull) or (kind == "pulls" and not issue.is_pull):
            continue
        names = {call.state.labels[i].name for i in issue.label_ids}
        if not wanted <= names:
            continue
        text = f"{issue.title}\n{issue.body}".lower()
        if not all(w in text for w in words):
            continue
        issues.append(call.convert.issue(issue))
    page, headers = paginate(call, issues)
    return json_response(page, headers=headers)


def create_issue(call: Call) -> Response:
    """Gitea CreateIssue: title required (422); 201 with the issue."""
    repo, mode = call.repo()
    doer = call.token_user()
    form = call.form()
    if not str(form.get("title") or "").strip():
        raise ApiError(422, "[Title]: Required")
    issue, outcome = call.service.create_issue(
        repo, doer, str(form["title"]), str(form.get("body") or "")
    )
    call.deliver(outcome)
    if mode >= Access.WRITE:  # labels and assignees only for writers
        labels = [call.state.label_of(repo, int(i)) for i in form.get("labels") or []]
        call.deliver(call.service.set_labels(issue, doer, labels, replace=False))
        logins = list(form.get("assignees") or []) + (
            [form["assignee"]] if form.get("assignee") else []
        )
        if logins:
            users = [call.state.user_by_login(str(x)) for x in logins]
            call.deliver(call.service.edit_issue(issue, doer, assignees=users))
    if form.get("closed"):
        call.deliver(call.service.edit_issue(issue, doer, state="closed"))
    return json_response(call.convert.issue(issue), 201)


def get_issue(call: Call) -> Response:
    _, _, issue = _issue(call)
    return json_response(call.convert.issue(issue))


def edit_issue(call: Call) -> Response:
    """Gitea EditIssue: the poster or a writer; assignees only by writers; 201."""
    _, mode, issue = _issue(call)
    doer = call.token_user()
    if doer.id != issue.poster_id and mode < Access.WRITE:
        raise ApiError(403, "only the poster or a writer may edit")
    form = call.form()
    if form.get("state") is not None and issue.pull is not None and issue.pull.merged:
        # EditIssue: 412 "cannot change state of this pull request, it was already merged"
        raise ApiError(412, "cannot change state of this pull request, it was already merged")
    assignees = None
    if mode >= Access.WRITE and ("assignees" in form or "assignee" in form):
        logins = list(form.get("assignees") or []) or (
            [form["assignee"]] if form.get("assignee") else []
        )
        assignees = [call.state.user_by_login(str(x)) for x in logins]
    outcome = call.service.edit_issue(
        issue,
        doer,
        title=form.get("title") or None,
        body=form.get("body"),
        state=form.get("state"),
        assignees=assignees,
    )
    call.deliver(outcome)
    return json_response(call.convert.issue(issue), 201)


# -- comments -------------------------------------------------------------------------


def list_comments(call: Call) -> Response:
    """Gitea ListIssueComments: plain comments, since/before (RFC 3339, 422 otherwise)
    compared with updated_unix inclusively, ordered by creation; X-Total-Count."""
    _, _, issue = _issue(call)
    try:
        since = parse_rfc3339(call.query["since"]) if call.query.get("since") else None
        before = parse_rfc3339(call.query["before"]) if call.query.get("before") else None
    except ValueError as exc:
        raise ApiError(422, str(exc)) from None
    comments = [
        call.convert.comment(c)
        for c in call.state.comments_of(issue)
        if (since is None or c.updated >= since) and (before is None or c.updated <= before)
    ]
    return json_response(comments, headers={"X-Total-Count": str(len(comments))})


def create_comment(call: Call) -> Response:
    """Gitea CreateIssueComment: body required; a locked issue needs write or site admin;
    201 with the comment; the issue_comment hooks fire with the token's user as sender."""
    _, mode, issue = _issue(call)
    doer = call.token_user()
    body = call.form().get("body")
    if not isinstance(body, str) or not body:
        raise ApiError(422, "[Body]: Required")
    if issue.is_locked and mode < Access.WRITE and not doer.is_admin:
        raise ApiError(403, "Comment on locked issue")
    comment, outcome = call.service.create_comment(issue, doer, body)
    call.deliver(outcome)
    return json_response(call.convert.comment(comment), 201)


def _comment(call: Call) -> tuple[Access, Comment]:
    repo, mode = call.repo()
    comment = call.state.comments.get(call.int_param("id"))
    if comment is None:
        raise not_found("comment does not exist")
    if call.state.issues[comment.issue_id].repo_id != repo.id:
        raise not_found()
    return mode, comment


def get_comment(call: Call) -> Response:
    if code_comment(call, call.int_param("id")) is not None:
        return empty(204)  # GetIssueComment: not a plain comment
    _, comment = _comment(call)
    return json_response(call.convert.comment(comment))


def _may_change(call: Call, mode: Access, comment: Comment) -> User:
    # editIssueComment/deleteIssueComment: 403 unless the poster or a writer
    doer = call.doer
    if doer is None or (doer.id != comment.poster_id and mode < Access.WRITE):
        raise ApiError(403, "only the poster or a writer may change a comment")
    return doer


def edit_comment(call: Call) -> Response:
    code = code_comment(call, call.int_param("id"))
    if code is not None:
        return _edit_code_comment(call, code)
    mode, comment = _comment(call)
    doer = _may_change(call, mode, comment)
    body = call.form().get("body")
    if not isinstance(body, str) or not body:
        raise ApiError(422, "[Body]: Required")
    call.deliver(call.service.edit_comment(comment, doer, body))
    return json_response(call.convert.comment(comment))


def _edit_code_comment(call: Call, code: CodeComment) -> Response:
    """editIssueComment of a code comment (HasContentSupport): the poster or a writer."""
    _, mode = call.repo()
    doer = call.doer
    if doer is None or (doer.id != code.poster_id and mode < Access.WRITE):
        raise ApiError(403, "only the poster or a writer may change a comment")
    body = call.form().get("body")
    if not isinstance(body, str) or not body:
        raise ApiError(422, "[Body]: Required")
    call.deliver(edit(call.service, code, doer, body))
    return json_response(api_comment(call.convert, code))


def delete_comment(call: Call) -> Response:
    mode, comment = _comment(call)
    doer = _may_change(call, mode, comment)
    call.deliver(call.service.delete_comment(comment, doer))
    return empty(204)


# -- issue labels ---------------------------------------------------------------------


def get_issue_labels(call: Call) -> Response:
    _, _, issue = _issue(call)
    return json_response([call.convert.label(call.state.labels[i]) for i in issue.label_ids])


def _set_issue_labels(call: Call, *, replace: bool) -> Response:
    """Gitea AddIssueLabels/ReplaceIssueLabels: {labels: [ids or names]}; the issue's
    labels come back (200)."""
    repo, mode, issue = _issue(call)
    doer = call.token_user()
    _writer(mode, doer)
    refs = call.form().get("labels") or []
    try:
        labels = [call.state.label_of(repo, r if isinstance(r, int) else str(r)) for r in refs]
    except NotFound as exc:
        raise ApiError(422, str(exc)) from None
    call.deliver(call.service.set_labels(issue, doer, labels, replace=replace))
    return json_response([call.convert.label(call.state.labels[i]) for i in issue.label_ids])


def add_issue_labels(call: Call) -> Response:
    return _set_issue_labels(call, replace=False)


def replace_issue_labels(call: Call) -> Response:
    return _set_issue_labels(call, replace=True)


def delete_issue_label(call: Call) -> Response:
    _, mode, issue = _issue(call)
    doer = call.token_user()
    _writer(mode, doer)
    label_id = call.int_param("id")
    if label_id not in issue.label_ids:
        raise ApiError(422, "label not on issue")
    remaining = [call.state.labels[i] for i in issue.label_ids if i != label_id]
    call.deliver(call.service.set_labels(issue, doer, remaining, replace=True))
    return empty(204)


# -- pull requests --------------------------------------------------------------------


def list_pulls(call: Call) -> Response:
    repo, _ = call.repo()
    state = call.query.get("state", "open")
    pulls = [
        call.convert.pull(i, call.doer)
        for i in reversed(call.state.repo_issues(repo))
        if i.is_pull and (state == "all" or i.state == state)
    ]
    page, headers = paginate(call, pulls)
    return json_response(page, headers=headers)


def get_pull(call: Call) -> Response:
    _, _, issue = _pull(call)
    return json_response(call.convert.pull(issue, call.doer))


def create_pull(call: Call) -> Response:
    """Gitea CreatePullRequest: head "branch" or "owner:branch"; 409 for a duplicate."""
    repo, _ = call.repo()
    doer = call.token_user()
    form = call.form()
    head, base, title = (str(form.get(k) or "") for k in ("head", "base", "title"))
    if not head or not base or not title:
        raise ApiError(422, "head, base and title are required")
    head_owner, _, head_branch = head.rpartition(":")
    head_repo = repo
    if head_owner and head_owner.lower() != call.state.owner_of(repo).login.lower():
        forks = [
            r
            for r in call.state.repos.values()
            if r.parent_id == repo.id and call.state.owner_of(r).login.lower() == head_owner.lower()
        ]
        if not forks:
            raise not_found("head repository does not exist")
        head_repo = forks[0]
    if GitRepo(head_repo.path).branch_sha(head_branch) is None:
        raise not_found("head branch does not exist")
    if GitRepo(repo.path).branch_sha(base) is None:
        raise not_found("base branch does not exist")
    for other in call.state.repo_issues(repo):
        pr = other.pull
        if (
            pr
            and other.state == "open"
            and (pr.head_repo_id, pr.head_branch, pr.base_branch)
            == (head_repo.id, head_branch, base)
        ):
            raise ApiError(409, f"pull request already exists for these targets [id: {pr.id}]")
    issue, outcome = call.service.create_pull(
        repo, doer, title, str(form.get("body") or ""), head_repo, head_branch, base
    )
    call.deliver(outcome)
    return json_response(call.convert.pull(issue, doer), 201)


def merge_pull(call: Call) -> Response:
    """Gitea MergePullRequest: 405 when not allowed, already merged or not mergeable."""
    _, mode, issue = _pull(call)
    doer = call.token_user()
    assert issue.pull is not None
    if mode < Access.WRITE:
        raise ApiError(405, "User not allowed to merge PR")
    if issue.pull.merged or issue.state != "open":
        raise ApiError(405, "The PR is already merged or closed")
    message = call.form().get("MergeMessageField")
    try:
        _, outcome = call.service.merge_pull(issue, doer, str(message) if message else None)
    except ValueError as exc:
        raise ApiError(405, f"Please try again later: {exc}") from None
    call.deliver(outcome)
    return empty(200)


def is_merged(call: Call) -> Response:
    _, _, issue = _pull(call)
    assert issue.pull is not None
    return empty(204) if issue.pull.merged else empty(404)


_ISSUE = "/repos/{owner}/{repo}/issues/{index}"
ROUTES: list[RouteSpec] = [
    ("GET", "/repos/{owner}/{repo}/issues", list_issues),
    ("POST", "/repos/{owner}/{repo}/issues", create_issue),
    ("GET", "/repos/{owner}/{repo}/issues/comments/{id}", get_comment),
    ("PATCH", "/repos/{owner}/{repo}/issues/comments/{id}", edit_comment),
    ("DELETE", "/repos/{owner}/{repo}/issues/comments/{id}", delete_comment),
    ("GET", _ISSUE, get_issue),
    ("PATCH", _ISSUE, edit_issue),
    ("GET", f"{_ISSUE}/comments", list_comments),
    ("POST", f"{_ISSUE}/comments", create_comment),
    ("PATCH", f"{_ISSUE}/comments/{{id}}", edit_comment),  # deprecated form, index ignored
    ("DELETE", f"{_ISSUE}/comments/{{id}}", delete_comment),
    ("GET", f"{_ISSUE}/labels", get_issue_labels),
    ("POST", f"{_ISSUE}/labels", add_issue_labels),
    ("PUT", f"{_ISSUE}/labels", replace_issue_labels),
    ("DELETE", f"{_ISSUE}/labels/{{id}}", delete_issue_label),
    ("GET", "/repos/{owner}/{repo}/pulls", list_pulls),
    ("POST", "/repos/{owner}/{repo}/pulls", create_pull),
    ("GET", "/repos/{owner}/{repo}/pulls/{index}", get_pull),
    ("POST", "/repos/{owner}/{repo}/pulls/{index}/merge", merge_pull),
    ("GET", "/repos/{owner}/{repo}/pulls/{index}/merge", is_merged),
]
