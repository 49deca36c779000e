"""The Gitea webhook payloads forgeflow reads, as pydantic models: ``hook.go``
IssuePayload, PullRequestPayload, IssueCommentPayload, ReleasePayload and
RepositoryPayload, as services/webhook/notifier.go fills them in, and the structs they
carry (``user.go`` User, ``repo.go`` Repository, ``issue.go`` Issue/PullRequestMeta,
``pull.go`` PullRequest/PRBranchInfo, ``issue_comment.go`` Comment, ``issue_label.go``
Label, ``release.go`` Release), each with only the fields forgeflow reads.

A delivery is read with other rules than a REST answer (gitea/models.py). What
forgeflow needs is required and strictly typed (a JSON "7" is not the number 7; text
holds no NUL, which no database keeps and Gitea never sends): a delivery without it is
refused, or gives no event, naming the field. Everything else reads as absent (None)
when Gitea sent something else, so an odd optional field never costs a delivery.
Unknown fields are ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from annotated_types import Gt
from pydantic import (
    BaseModel,
    ConfigDict,
    Strict,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import PydanticCustomError

NUL_CHARACTER = "nul_character"  # the error type of text holding a NUL


def _no_nul(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    text = handler(value)
    if "\x00" in text:
        raise PydanticCustomError(NUL_CHARACTER, "contains a NUL character")
    return text


def _absent_if_unreadable(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    try:
        return handler(value)
    except ValidationError:
        return None


T = TypeVar("T")
Text = Annotated[str, Strict(), WrapValidator(_no_nul)]
Id = Annotated[int, Strict(), Gt(0)]  # an issue's number, a comment's or release's id
Maybe = Annotated[T | None, WrapValidator(_absent_if_unreadable)]


class _Payload(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


class HookUser(_Payload):
    """``User``: a payload's sender, an author, an assignee."""

    login: Text


class HookRepo(_Payload):
    """``Repository``, as convert.ToRepo fills it in for a payload."""

    owner: HookUser
    name: Text
    full_name: Maybe[Text] = None
    clone_url: Maybe[Text] = None
    default_branch: Maybe[Text] = None


class HookLabel(_Payload):
    name: Text


class HookPullMeta(_Payload):
    """``PullRequestMeta``: an issue's ``pull_request``, not null when the issue is a
    pull request (every Gitea version sends it; 1.9 and older had no ``is_pull``)."""

    merged: Maybe[bool] = None


class HookThread(_Payload):
    """What Gitea's ``Issue`` and ``PullRequest`` both carry and forgeflow reads."""

    number: Id
    title: Maybe[Text] = None
    body: Maybe[Text] = None
    user: Maybe[HookUser] = None
    html_url: Maybe[Text] = None
    assignees: Maybe[list[Maybe[HookUser]]] = None

    def assignee_logins(self) -> list[str]:
        return [user.login for user in self.assignees or [] if user is not None]


class HookIssue(HookThread):
    labels: Maybe[list[Maybe[HookLabel]]] = None
    pull_request: Maybe[HookPullMeta] = None

    def label_names(self) -> list[str]:
        return [label.name for label in self.labels or [] if label is not None]


class HookBranch(_Payload):
    """``PRBranchInfo``: ``repo_id`` tells a fork's head from the base repository's."""

    ref: Maybe[Text] = None
    sha: Maybe[Text] = None
    repo_id: Maybe[int] = None
    repo: Maybe[HookRepo] = None


class HookPull(HookThread):
    draft: Maybe[bool] = None
    merged: Maybe[bool] = None
    merged_by: Maybe[HookUser] = None
    merge_commit_sha: Maybe[Text] = None
    head: Maybe[HookBranch] = None
    base: Maybe[HookBranch] = None


class HookComment(_Payload):
    """``Comment``."""

    id: Id
    body: Text
    user: HookUser
    html_url: Maybe[Text] = None
    created_at: Maybe[Text] = None


class HookRelease(_Payload):
    """``Release``: ``name`` is its title, ``body`` its note, ``author`` its publisher."""

    id: Id
    tag_name: Maybe[Text] = None
    name: Maybe[Text] = None
    body: Maybe[Text] = None
    target_commitish: Maybe[Text] = None
    draft: Maybe[bool] = None
    prerelease: Maybe[bool] = None
    author: Maybe[HookUser] = None
    html_url: Maybe[Text] = None


class HookPayload(_Payload):
    """What every payload forgeflow reads has: ``RepositoryPayload`` is just this."""

    action: Text
    repository: HookRepo
    sender: Maybe[HookUser] = None


class IssuePayload(HookPayload):
    issue: HookIssue


class PullRequestPayload(HookPayload):
    pull_request: HookPull


class ReviewRequestPayload(PullRequestPayload):
    """``PullRequestPayload`` of ``pull_request_review_request`` (notifier.go
    PullRequestReviewRequest): action ``review_requested`` or
    ``review_request_removed``, the reviewer asked, the sender who asked."""

    requested_reviewer: Maybe[HookUser] = None


class HookReview(_Payload):
    """``ReviewPayload``: the hook event's name and the review's body."""

    type: Maybe[Text] = None
    content: Maybe[Text] = None


class ReviewedPayload(PullRequestPayload):
    """``PullRequestPayload`` of a submitted review (notifier.go PullRequestReview:
    action ``reviewed``, the reviewer as sender, ``review`` {type, content}; the review's
    line comments are not in it)."""

    review: Maybe[HookReview] = None


class IssueCommentPayload(HookPayload):
    """``IssueCommentPayload``. Gitea's has no ``pull_request``; a sender that adds one
    (GitHub's shape) gives the task its pull request's refs up front."""

    issue: HookIssue
    comment: HookComment
    is_pull: Maybe[bool] = None
    pull_request: Maybe[HookPull] = None

    def on_pull_request(self) -> bool:
        """``is_pull`` (Gitea 1.10 and later) or, as every version sends it, an issue
        whose ``pull_request`` is not null."""
        return self.is_pull is True or self.issue.pull_request is not None


class ReleasePayload(HookPayload):
    release: HookRelease


class _CommentId(_Payload):
    id: Annotated[int, Strict()]


class CommentKey(_Payload):
    """What names a comment delivery that came without a delivery id."""

    action: Text
    comment: _CommentId


class _Object(_Payload):
    """Any JSON object (its fields unread)."""


class _IssueKind(_Payload):
    pull_request: Maybe[_Object] = None


class CommentShape(_Payload):
    """What tells apart the payloads Gitea sends under its comment events: a comment's,
    or (Gitea 1.10 to 1.19.0) a review's with no ``comment`` (webhook.event_type_of)."""

    action: Maybe[str] = None
    comment: Maybe[_Object] = None
    review: Maybe[_Object] = None
    is_pull: Maybe[bool] = None
    issue: Maybe[_IssueKind] = None

    def on_pull_request(self) -> bool:
        """As :meth:`IssueCommentPayload.on_pull_request`."""
        return self.is_pull is True or (
            self.issue is not None and self.issue.pull_request is not None
        )

    def is_review(self) -> bool:
        """A review sent under a comment event (Gitea 1.10 to 1.19.0): ``action``
        reviewed and a ``review``; anything else without a comment is a comment payload
        that lacks it (stored under the event it came as, refused as invalid)."""
        return self.comment is None and (self.action == "reviewed" or self.review is not None)
