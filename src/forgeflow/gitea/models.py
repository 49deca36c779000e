"""The Gitea shapes forgeflow reads, as pydantic models (one home for them): the REST
API's answers, then the webhook payloads.

Fields follow Gitea's ``modules/structs`` (``issue.go`` Issue, ``issue_comment.go``
Comment, ``pull.go`` PullRequest/PRBranchInfo, ``issue_label.go`` Label,
``repo.go`` Repository, ``user.go`` User, ``hook.go`` Hook and the payloads,
``release.go`` Release, ``repo_branch.go`` Branch, ``status.go``
CommitStatus/CombinedStatus, ``pull.go`` ChangedFile). Unknown fields are ignored:
Gitea adds fields between releases.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, TypeVar

from annotated_types import Gt
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import PydanticCustomError


class _Shape(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class User(_Shape):
    id: int = 0
    login: str = ""
    is_admin: bool = False


class Label(_Shape):
    id: int
    name: str
    color: str = ""
    description: str = ""


class PullMeta(_Shape):
    """``Issue.pull_request``: present when the issue is a pull request."""

    merged: bool = False


class Issue(_Shape):
    id: int = 0
    number: int
    title: str = ""
    body: str = ""
    state: str = "open"
    user: User = Field(default_factory=User)
    labels: list[Label] = Field(default_factory=list)
    html_url: str = ""
    comments: int = 0
    pull_request: PullMeta | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


class Comment(_Shape):
    id: int
    body: str = ""
    user: User = Field(default_factory=User)
    html_url: str = ""
    issue_url: str = ""
    created_at: datetime | None = None
    updated_at: datetime | None = None


class Repository(_Shape):
    """``Repository`` (GET /repos/{owner}/{repo}, and a pull request's ``head.repo``)."""

    id: int = 0
    full_name: str = ""
    default_branch: str = ""
    clone_url: str = ""
    private: bool = False


class Branch(_Shape):
    """``PRBranchInfo``: one side of a pull request."""

    label: str = ""
    ref: str = ""
    sha: str = ""
    repo: Repository | None = None


class BranchCommit(_Shape):
    """``PayloadCommit`` as ``Branch.commit`` carries it: ``id`` is the commit's sha."""

    id: str = ""


class RepoBranch(_Shape):
    """``repo_branch.go`` Branch (GET /repos/{owner}/{repo}/branches/{branch})."""

    name: str = ""
    commit: BranchCommit | None = None


class Hook(_Shape):
    """``hook.go`` Hook. ``config`` is Gitea's map[string]string; it never includes the
    secret (Gitea does not show it), so a hook's secret cannot be compared."""

    id: int
    type: str = ""
    active: bool = False
    events: list[str] = Field(default_factory=list)
    config: dict[str, str] = Field(default_factory=dict)


class HookOption(_Shape):
    """``hook.go`` CreateHookOption; an edit sends the same without ``type``
    (EditHookOption). ``config`` holds the url, the content type and the secret, so
    it is left out of the model's repr (a log line or a traceback never shows it)."""

    type: str = "gitea"
    active: bool = True
    events: list[str]
    branch_filter: str = "*"
    config: dict[str, str] = Field(repr=False)

    def create_body(self) -> dict[str, Any]:
        return self.model_dump()

    def edit_body(self) -> dict[str, Any]:
        return self.model_dump(exclude={"type"})


class ServerVersion(_Shape):
    """``miscellaneous.go`` ServerVersion (GET /version)."""

    version: str = ""


class RepoPermission(_Shape):
    """``repo_collaborator.go`` RepoCollaboratorPermission: ``permission`` is none, read,
    write, admin or owner."""

    permission: str = "none"


class PullRequest(_Shape):
    id: int = 0
    number: int
    title: str = ""
    body: str = ""
    state: str = "open"
    draft: bool = False
    merged: bool = False
    mergeable: bool = False
    user: User = Field(default_factory=User)
    labels: list[Label] = Field(default_factory=list)
    head: Branch = Field(default_factory=Branch)
    base: Branch = Field(default_factory=Branch)
    html_url: str = ""


class ChangedFile(_Shape):
    filename: str
    previous_filename: str = ""
    status: str = ""
    additions: int = 0
    deletions: int = 0
    changes: int = 0


class CommitStatus(_Shape):
    id: int = 0
    status: str = ""  # Gitea's JSON name for the state ("pending", "success", ...)
    context: str = ""
    description: str = ""
    target_url: str = ""
    created_at: datetime | None = None


class CombinedStatus(_Shape):
    state: str = ""
    sha: str = ""
    total_count: int = 0
    statuses: list[CommitStatus] = Field(default_factory=list)


# -- webhook payloads (hook.go; filled in by services/webhook/notifier.go) -------------
#
# A delivery is read with other rules than an answer. What forgeflow needs is required
# and strictly typed (a JSON "7" is not the number 7; text holds no NUL, which no
# database keeps and Gitea never sends): a delivery without it is refused, or gives no
# event, naming the field. Everything else reads as absent (None) when Gitea sent
# something else, so an odd optional field never costs a delivery.

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
