"""Where a session's work is published (pure rules, no I/O).

Each session has a local branch in its worktree (``ccweb/<kind>-<n>``). After a turn in
which the agent committed, forgeflow pushes it, fast-forward only and never with force,
to the session's target branch on Gitea:

- an issue: a branch of the same name, ``ccweb/issue-<n>``;
- a pull request from a branch of the same repository: that head branch (a protected
  branch or a missing permission refuses the push, which fails no task);
- a pull request from a fork: nothing; the work stays in the worktree.

The repository's default branch is never a target.
"""

from __future__ import annotations

from dataclasses import dataclass

from forgeflow.domain.ids import ResourceKind, ResourceRef
from forgeflow.domain.paths import session_branch
from forgeflow.domain.records import Refs

PUSH_TOOL = "push_branch"  # the agent's tool to publish before its turn ends


@dataclass(frozen=True, slots=True)
class Target:
    """What to push: ``local`` (the worktree's branch) to ``remote`` on Gitea; ``remote``
    is None when the work is not published, with ``why`` saying so."""

    local: str
    remote: str | None
    why: str = ""


def target(resource: ResourceRef, refs: Refs | None, default_branch: str) -> Target:
    local = session_branch(resource)
    if resource.kind is ResourceKind.ISSUE:
        remote: str | None = local
        why = ""
    else:
        head = refs.head if refs else None
        head_repo = refs.head_repo if refs else None
        same_repo = head_repo is not None and (
            head_repo.casefold() == resource.repo.full_name.casefold()
        )
        remote = head if same_repo and head else None
        why = "" if remote else "this pull request comes from a fork"
    if remote is not None and remote == default_branch:
        return Target(local, None, f"its branch is the default branch {default_branch}")
    return Target(local, remote, why)


def where_work_goes(t: Target, default_branch: str, tool: str) -> str:
    """The prompt's line about publishing."""
    if t.remote is None:
        return (
            f"Your work: commit on branch {t.local}. It is not published ({t.why}): "
            "your commits stay in this worktree."
        )
    return (
        f"Your work: commit on branch {t.local}. When your turn ends forgeflow pushes it "
        f"to the branch {t.remote} on Gitea (fast-forward only). To push earlier, for "
        f"example before you open or update a pull request (head {t.remote}, base "
        f"{default_branch}) with the Gitea tools, call the tool `{tool}`. You have no git "
        "credentials: `git push` does not work here."
    )
