"""The Gitea shapes forgeflow reads, as pydantic models (one home for them).

Fields follow Gitea's ``modules/structs`` (``issue.go`` Issue, ``issue_comment.go``
Comment, ``pull.go`` PullRequest/PRBranchInfo, ``issue_label.go`` Label,
``repo.go`` Repository, ``status.go`` CommitStatus/CombinedStatus, ``pull.go``
ChangedFile). Unknown fields are ignored: Gitea adds fields between releases.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Shape(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class User(_Shape):
    id: int = 0
    login: str = ""


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


class RepoMeta(_Shape):
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
    repo: RepoMeta | None = None


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


def parse_list(model: type[_Shape], value: Any) -> list[Any]:
    """A JSON array of ``model``; anything else is a malformed answer (ValueError)."""
    if not isinstance(value, list):
        raise ValueError(f"expected a JSON array of {model.__name__}")
    return [model.model_validate(v) for v in value]
