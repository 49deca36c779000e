"""What the workspace manager hands back: a prepared clone, a pull request's refs, a
session's worktree. Frozen, so a caller cannot change what the manager found."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from forgeflow.workspace.status import WorktreeStatus


@dataclass(frozen=True)
class RepoCheckout:
    path: str
    action: Literal["cloned", "fetched", "reused"]
    # sha of origin/<default branch> after the clone or fetch; "reused": as of the last one
    head: str
    fetched_ago: float = 0.0  # seconds since this manager last cloned or fetched the clone


@dataclass(frozen=True)
class PullRequestRefs:
    number: int
    base_ref: str
    head_ref: str
    head_sha: str
    head_clone_url: str  # the head may live in a fork


@dataclass(frozen=True)
class SessionWorktree:
    path: str
    branch: str
    status: WorktreeStatus
    upstream_moved: bool
    fast_forwarded: bool = False
    created: bool = False
    # An issue session's branch on Gitea, as the worktree was checked against (None:
    # not published); the worktree of a new session starts there (published.py).
    published: str | None = None
