"""Where a session's work is pushed (domain/publish.py)."""

from __future__ import annotations

from forgeflow.domain.ids import RepoRef, ResourceKind, ResourceRef
from forgeflow.domain.publish import PUSH_TOOL, target, where_work_goes
from forgeflow.domain.records import Refs

REPO = RepoRef("acme", "widget")


def test_an_issue_pushes_its_own_branch() -> None:
    t = target(ResourceRef(REPO, ResourceKind.ISSUE, 3), None, "main")
    assert (t.local, t.remote) == ("ccweb/issue-3", "ccweb/issue-3")
    line = where_work_goes(t, "main", PUSH_TOOL)
    assert "ccweb/issue-3" in line and "push_branch" in line and "base main" in line


def test_a_pull_request_of_the_same_repository_pushes_its_head_branch() -> None:
    refs = Refs("main", "feature/x", None, "ACME/widget")
    t = target(ResourceRef(REPO, ResourceKind.PULL_REQUEST, 9), refs, "main")
    assert (t.local, t.remote) == ("ccweb/pull_request-9", "feature/x")


def test_a_pull_request_from_a_fork_publishes_nothing() -> None:
    refs = Refs("main", "feature/x", None, "mallory/widget")
    t = target(ResourceRef(REPO, ResourceKind.PULL_REQUEST, 9), refs, "main")
    assert t.remote is None and "fork" in t.why
    assert "stay in this worktree" in where_work_goes(t, "main", PUSH_TOOL)


def test_the_default_branch_is_never_a_target() -> None:
    refs = Refs("release", "main", None, "acme/widget")
    t = target(ResourceRef(REPO, ResourceKind.PULL_REQUEST, 4), refs, "main")
    assert t.remote is None and "default branch" in t.why
