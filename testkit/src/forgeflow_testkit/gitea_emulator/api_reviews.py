"""Pull request reviews and review requests (routers/api/v1/repo/pull_review.go).

Gitea's sources followed:

- ``CreatePullReview`` (POST ``/pulls/{index}/reviews``, ``CreatePullReviewOptions``
  {event, body, commit_id, comments[] {path, body, old_position, new_position}}): an
  empty ``commit_id`` is the head; each comment becomes a code comment on line
  ``new_position``, or ``-old_position`` when ``old_position`` > 0; the review is
  submitted with the event's type (``preparePullReviewType``: APPROVE, REQUEST_CHANGES,
  COMMENT; a COMMENT or REQUEST_CHANGES without a body and comments is 422; the poster
  may not approve or reject their own pull request: 422). Answers 200 with the review;
  then the notifier's ``pull_request_review_{approved,rejected,comment}`` hook.
- ``ListPullReviews`` / ``GetPullReview`` / ``GetPullReviewComments`` with
  ``convert/pull_review.go`` ``ToPullReview`` and ``ToPullReviewCommentList``
  (``position`` for a new-side line, ``original_position`` for an old-side one).
- ``CreateReviewRequests`` (POST ``/pulls/{index}/requested_reviewers``
  {reviewers, team_reviewers}): 201 with the REQUEST_REVIEW reviews made; each sends
  ``pull_request_review_request`` with action ``review_requested`` and
  ``requested_reviewer`` (notifier.go PullRequestReviewRequest: the pull request
  converted with the doer, the repository with the doer's permission).

The emulator keeps the code comment's ``diff_hunk`` empty (Gitea cuts it from the diff).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from starlette.responses import Response, StreamingResponse

from .apibase import ApiError, Call, RouteSpec, json_response, not_found, paginate
from .convert import JSON, Converter
from .delivery import Delivery
from .gitrepo import GitRepo
from .gojson import go_json, rfc3339
from .hunks import diff_hunk
from .service import Outcome, Service
from .state import Access, Issue, State, User

# structs.ReviewStateType and the hook event of each submitted type.
_EVENTS = {"APPROVE": "APPROVED", "REQUEST_CHANGES": "REQUEST_CHANGES", "COMMENT": "COMMENT"}
_HOOKS = {
    "APPROVED": "pull_request_review_approved",
    "REQUEST_CHANGES": "pull_request_review_rejected",
    "COMMENT": "pull_request_review_comment",
}


@dataclass
class Review:
    id: int
    issue_id: int
    reviewer_id: int
    state: str  # APPROVED, REQUEST_CHANGES, COMMENT, REQUEST_REVIEW
    body: str
    commit_id: str
    created: datetime


@dataclass
class CodeComment:
    id: int
    review_id: int
    issue_id: int
    poster_id: int
    path: str
    line: int  # > 0 a new-side line, < 0 an old-side one (models/issues Comment.Line)
    body: str
    commit_id: str
    created: datetime
    diff_hunk: str = ""  # hunks.py


def reviews_of(state: State, issue: Issue) -> list[Review]:
    found: list[Review] = [r for r in state.reviews.values() if r.issue_id == issue.id]
    return sorted(found, key=lambda r: r.id)


def review_json(convert: Converter, review: Review) -> JSON:
    state = convert.state
    issue = state.issues[review.issue_id]
    count = sum(1 for c in state.review_comments.values() if c.review_id == review.id)
    html = convert.issue_url(issue)
    return {
        "id": review.id,
        "user": convert.user(state.users[review.reviewer_id]),
        "team": None,
        "state": review.state,
        "body": review.body,
        "commit_id": review.commit_id,
        "stale": False,
        "official": review.state in ("APPROVED", "REQUEST_CHANGES"),
        "dismissed": False,
        "comments_count": count,
        "submitted_at": rfc3339(review.created),
        "updated_at": rfc3339(review.created),
        "html_url": f"{html}#pullrequestreview-{review.id}",
        "pull_request_url": html,
    }


def comment_json(convert: Converter, c: CodeComment) -> JSON:
    issue = convert.state.issues[c.issue_id]
    html = convert.issue_url(issue)
    return {
        "id": c.id,
        "body": c.body,
        "user": convert.user(convert.state.users[c.poster_id]),
        "resolver": None,
        "pull_request_review_id": c.review_id,
        "created_at": rfc3339(c.created),
        "updated_at": rfc3339(c.created),
        "path": c.path,
        "commit_id": c.commit_id,
        "original_commit_id": c.commit_id,
        "diff_hunk": c.diff_hunk,
        "position": c.line if c.line > 0 else 0,
        "original_position": -c.line if c.line < 0 else 0,
        # Comment.hashLink: a code comment of a submitted review links to the timeline.
        "html_url": f"{html}#issuecomment-{c.id}",
        "pull_request_url": html,
    }


def submit(service: Service, issue: Issue, doer: User, form: JSON) -> tuple[Review, Outcome]:
    """CreatePullReview's effect, under the state's lock."""
    state = service.state
    event = str(form.get("event") or "")
    if event not in _EVENTS:
        raise ApiError(422, f"review event {event!r} is not supported here")
    body = str(form.get("body") or "")
    comments = form.get("comments") or []
    if not isinstance(comments, list):
        raise ApiError(422, "comments must be a list")
    if event != "APPROVE" and not body.strip() and not comments:
        raise ApiError(422, "review event COMMENT requires a body or a comment")
    if event != "COMMENT" and doer.id == issue.poster_id:
        raise ApiError(422, "approve or reject your own pull is not allowed")
    commit_id = str(form.get("commit_id") or "") or _head(state, issue)
    now = state.now()
    review = Review(
        state.next_id("review"), issue.id, doer.id, _EVENTS[event], body, commit_id, now
    )
    git, base = GitRepo(state.repos[issue.repo_id].path), _base(state, issue)
    for raw in comments:
        if not isinstance(raw, dict):
            raise ApiError(422, "a comment must be an object")
        old, new = int(raw.get("old_position") or 0), int(raw.get("new_position") or 0)
        line = -old if old > 0 else new
        path = str(raw.get("path") or "")
        cid = state.next_id("comment")
        state.review_comments[cid] = CodeComment(
            cid,
            review.id,
            issue.id,
            doer.id,
            path,
            line,
            str(raw.get("body") or ""),
            commit_id,
            now,
            diff_hunk(git, base, commit_id, path, line),
        )
    state.reviews[review.id] = review
    _consume_request(state, issue, doer)
    payload = service.payloads.pull_payload("reviewed", issue, doer)
    payload["requested_reviewer"] = service.convert.user(doer)
    payload["review"] = {"type": _HOOKS[review.state], "content": body}
    repo = state.repos[issue.repo_id]
    return review, Outcome(service.deliverer.prepare(repo, _HOOKS[review.state], payload, None))


def _consume_request(state: State, issue: Issue, reviewer: User) -> None:
    """models/issues SubmitReview: the reviewer's review request is removed."""
    for r in [r for r in reviews_of(state, issue) if r.reviewer_id == reviewer.id]:
        if r.state == "REQUEST_REVIEW":
            del state.reviews[r.id]
    assert issue.pull is not None
    if reviewer.id in issue.pull.requested_reviewer_ids:
        issue.pull.requested_reviewer_ids.remove(reviewer.id)


def _base(state: State, issue: Issue) -> str:
    """The pull request's merge base (the diff a code comment's hunk is cut from)."""
    assert issue.pull is not None
    git = GitRepo(state.repos[issue.repo_id].path)
    base, head = git.branch_sha(issue.pull.base_branch), _head(state, issue)
    return (git.merge_base(base, head) if base and head else None) or ""


def _head(state: State, issue: Issue) -> str:
    repo = state.repos[issue.repo_id]
    return GitRepo(repo.path).rev_parse(f"refs/pull/{issue.index}/head") or ""


def request_review(
    service: Service, issue: Issue, doer: User, reviewer: User
) -> tuple[Review, Outcome]:
    """A review request (pull_service.ReviewRequest): a REQUEST_REVIEW review row and
    the ``pull_request_review_request`` hook. Its ReviewRequest comment moves the pull
    request's ``updated_at`` (models/issues/comment.go updateCommentInfos)."""
    state = service.state
    review = Review(
        state.next_id("review"), issue.id, reviewer.id, "REQUEST_REVIEW", "", "", state.now()
    )
    issue.updated = review.created
    state.reviews[review.id] = review
    assert issue.pull is not None
    if reviewer.id not in issue.pull.requested_reviewer_ids:
        issue.pull.requested_reviewer_ids.append(reviewer.id)
    payload = service.payloads.pull_payload("review_requested", issue, doer)
    payload["pull_request"] = service.convert.pull(issue, doer)
    payload["requested_reviewer"] = service.convert.user(reviewer)
    repo = state.repos[issue.repo_id]
    tasks = service.deliverer.prepare(repo, "pull_request_review_request", payload, None)
    return review, Outcome(tasks)


def _pull(call: Call) -> tuple[Access, Issue]:
    repo, mode = call.repo()
    try:
        issue = call.state.issue_by_index(repo, call.int_param("index"))
    except LookupError:
        raise not_found() from None
    if issue.pull is None:
        raise not_found()
    return mode, issue


def _review(call: Call, issue: Issue) -> Review:
    review: Review | None = call.state.reviews.get(call.int_param("id"))
    if review is None or review.issue_id != issue.id:
        raise not_found()
    return review


def create_review(call: Call) -> Response:
    _, issue = _pull(call)
    doer = call.token_user()
    review, outcome = submit(call.service, issue, doer, call.form())
    call.deliver(outcome)
    return json_response(review_json(call.convert, review))


def list_reviews(call: Call) -> Response:
    _, issue = _pull(call)
    items, headers = paginate(call, reviews_of(call.state, issue))
    return json_response([review_json(call.convert, r) for r in items], headers=headers)


def get_review(call: Call) -> Response:
    _, issue = _pull(call)
    return json_response(review_json(call.convert, _review(call, issue)))


def review_comments(call: Call) -> Response:
    _, issue = _pull(call)
    review = _review(call, issue)
    found = sorted(
        (c for c in call.state.review_comments.values() if c.review_id == review.id),
        key=lambda c: c.id,
    )
    items = [comment_json(call.convert, c) for c in found]

    # Streamed item by item: one review's line comments are one unpaged answer of any
    # size on Gitea, and a test sees what the client holds of it, not what we built.
    def chunks() -> Iterator[bytes]:
        yield b"["
        for i, item in enumerate(items):
            yield (b"," if i else b"") + go_json(item).rstrip(b"\n")
        yield b"]\n"

    return StreamingResponse(chunks(), media_type="application/json;charset=utf-8")


def create_review_requests(call: Call) -> Response:
    mode, issue = _pull(call)
    doer = call.token_user()
    if mode < Access.WRITE and doer.id != issue.poster_id:
        raise ApiError(403, "not allowed to request reviews")
    made = []
    for login in call.form().get("reviewers") or []:
        try:
            reviewer = call.state.user_by_login(str(login))
        except LookupError:
            raise ApiError(422, f"user {login!r} does not exist") from None
        review, outcome = request_review(call.service, issue, doer, reviewer)
        call.deliver(outcome)
        made.append(review_json(call.convert, review))
    return json_response(made, 201)


ROUTES: list[RouteSpec] = [
    ("POST", "/repos/{owner}/{repo}/pulls/{index}/reviews", create_review),
    ("GET", "/repos/{owner}/{repo}/pulls/{index}/reviews", list_reviews),
    ("GET", "/repos/{owner}/{repo}/pulls/{index}/reviews/{id}", get_review),
    ("GET", "/repos/{owner}/{repo}/pulls/{index}/reviews/{id}/comments", review_comments),
    ("POST", "/repos/{owner}/{repo}/pulls/{index}/requested_reviewers", create_review_requests),
]


class ReviewControls:
    """Test helpers of GiteaEmulator: act as a user in the web UI, deliver at once."""

    _state: State
    _service: Service
    _convert: Converter

    def _deliver(self, outcome: Outcome) -> list[Delivery]:
        raise NotImplementedError  # GiteaEmulator's

    def request_review(
        self, owner: str, repo: str, index: int, *, reviewer: str, by: str
    ) -> list[Delivery]:
        """``by`` adds ``reviewer`` as a requested reviewer of pull request ``index``;
        returns the webhook deliveries it made."""
        with self._state.lock:
            issue = self._state.issue_by_index(self._state.repo_by_name(owner, repo), index)
            doer, who = self._state.user_by_login(by), self._state.user_by_login(reviewer)
            _, outcome = request_review(self._service, issue, doer, who)
        return self._deliver(outcome)

    def line_comment(
        self,
        owner: str,
        repo: str,
        index: int,
        *,
        path: str,
        line: int,
        body: str,
        by: str,
        side: str = "new",
    ) -> list[Delivery]:
        """``by`` adds a single comment on ``line`` of ``path`` (``side`` "new" or "old")
        in the files view: a review of type Comment with no body (CreateCodeComment), and
        its ``pull_request_review_comment`` hook; returns the deliveries."""
        with self._state.lock:
            issue = self._state.issue_by_index(self._state.repo_by_name(owner, repo), index)
            doer = self._state.user_by_login(by)
            where = "old_position" if side == "old" else "new_position"
            form: JSON = {
                "event": "COMMENT",
                "body": "",
                "comments": [{"path": path, "body": body, where: line}],
            }
            _, outcome = submit(self._service, issue, doer, form)
        return self._deliver(outcome)

    def submit_review(
        self,
        owner: str,
        repo: str,
        index: int,
        *,
        by: str,
        lines: list[tuple[str, int, str]],
        event: str = "COMMENT",
        body: str = "",
    ) -> list[Delivery]:
        """``by`` submits a review of ``event`` (APPROVE, REQUEST_CHANGES, COMMENT) with
        ``body`` and a line comment per ``(path, new-side line, text)`` in the files view
        (CreatePullReview's effect and its hook); returns the deliveries."""
        with self._state.lock:
            issue = self._state.issue_by_index(self._state.repo_by_name(owner, repo), index)
            form: JSON = {
                "event": event,
                "body": body,
                "comments": [{"path": p, "body": b, "new_position": n} for p, n, b in lines],
            }
            _, outcome = submit(self._service, issue, self._state.user_by_login(by), form)
        return self._deliver(outcome)

    def reply_in_thread(self, comment_id: int, *, body: str, by: str) -> list[Delivery]:
        """``by`` replies in the conversation of code comment ``comment_id`` in the
        web UI (CreateCodeComment with replyReviewID): the ``pull_request_comment``
        hook; returns the deliveries."""
        from .api_threads import reply

        with self._state.lock:
            parent = self._state.review_comments[comment_id]
            _, outcome = reply(self._service, parent, self._state.user_by_login(by), body)
        return self._deliver(outcome)

    def set_reply_api(self, available: bool) -> None:
        """Whether the server has Gitea 1.27's review-comment reply endpoint."""
        with self._state.lock:
            self._state.reply_api = available

    def thread_comments(self, comment_id: int) -> list[JSON]:
        """The conversation of code comment ``comment_id`` (its file and signed line), as
        ``PullReviewComment`` JSON, oldest first."""
        with self._state.lock:
            c = self._state.review_comments[comment_id]
            return [
                comment_json(self._convert, x)
                for x in sorted(self._state.review_comments.values(), key=lambda x: x.id)
                if x.issue_id == c.issue_id and (x.path, x.line) == (c.path, c.line)
            ]

    def reviews(self, owner: str, repo: str, index: int) -> list[JSON]:
        """The pull request's reviews as the API lists them, each with its comments."""
        with self._state.lock:
            issue = self._state.issue_by_index(self._state.repo_by_name(owner, repo), index)
            found = []
            for r in reviews_of(self._state, issue):
                data = review_json(self._convert, r)
                data["comments"] = [
                    comment_json(self._convert, c)
                    for c in sorted(self._state.review_comments.values(), key=lambda c: c.id)
                    if c.review_id == r.id
                ]
                found.append(data)
            return found
