"""The Gitea REST API's answers forgeflow reads, as pydantic models; the webhook
payloads, read with stricter rules, are their sibling gitea/payloads.py.

Fields follow Gitea's ``modules/structs`` (``attachment.go`` Attachment, ``issue.go``
Issue, ``issue_comment.go`` Comment, ``pull.go`` PullRequest/PRBranchInfo, ``issue_label.go`` Label,
``repo.go`` Repository, ``user.go`` User, ``hook.go`` Hook, ``repo_branch.go``
Branch, ``status.go`` CommitStatus/CombinedStatus, ``pull.go`` ChangedFile).
Unknown fields are ignored: Gitea adds fields between releases.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from forgeflow.domain.json import JsonObject


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


class Attachment(_Shape):
    """``Attachment`` (modules/structs/attachment.go), an issue's or a comment's
    ``assets``. ``browser_download_url`` is never fetched: the download URL is built
    from the configured Gitea and the ``uuid`` (gitea/transport.attachment)."""

    id: int = 0
    name: str = ""
    size: int = 0
    uuid: str = ""
    browser_download_url: str = ""
    created_at: datetime | None = None


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
    assets: list[Attachment] | None = None  # Gitea sends null for none
    pull_request: PullMeta | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


class Comment(_Shape):
    id: int
    body: str = ""
    user: User = Field(default_factory=User)
    html_url: str = ""
    issue_url: str = ""
    assets: list[Attachment] | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


class Reaction(_Shape):
    """``Reaction`` (modules/structs/issue_reaction.go): who, which, when."""

    user: User = Field(default_factory=User)
    content: str = ""
    created_at: datetime | None = None


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

    def create_body(self) -> JsonObject:
        found: JsonObject = self.model_dump(mode="json")
        return found

    def edit_body(self) -> JsonObject:
        found: JsonObject = self.model_dump(mode="json", exclude={"type"})
        return found


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
