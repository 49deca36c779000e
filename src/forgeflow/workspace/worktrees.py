"""A session's git worktree as git keeps it: added on the session's own branch, listed
from the main clone's records, and compared with the pull request's head."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from forgeflow.workspace.git import GitRunner
from forgeflow.workspace.remote import is_ancestor

Relation = Literal["same", "ahead", "behind", "diverged"]


@dataclass(frozen=True)
class Registered:
    branch: str
    prunable: bool


async def add_worktree(git: GitRunner, main: str, path: str, branch: str, start: str) -> None:
    """Add the worktree at ``path`` on a new ``branch`` from ``start``, or on the branch
    as it is when the session's branch outlived its worktree."""
    # The common case (a new branch) in one git process; git's refusal (LC_ALL=C) says
    # when the branch or a stale registration is already there.
    new_branch = ("--no-track", "-b", branch, "--", path, start)
    args: tuple[str, ...] = new_branch
    for _ in range(3):
        res = await git.run("worktree", "add", *args, cwd=main, check=False)
        if res.returncode == 0:
            return
        if "is a missing but already registered worktree" in res.stderr:
            # Registered, but its directory is gone (deleted by hand): only the stale
            # administrative entry is dropped; the branch and its commits stay.
            await git.run("worktree", "prune", cwd=main)
        elif args == new_branch and f"a branch named '{branch}' already exists" in res.stderr:
            # The session's branch outlived its worktree (garbage-collected, or deleted
            # by hand): its commits are the session's work, so check it out as it is.
            args = ("--", path, branch)
        else:
            break
    raise git.failure("git worktree add", res)


async def registered(git: GitRunner, main: str) -> dict[str, Registered]:
    """The worktrees the main clone has registered, by real path."""
    out = await git.run("worktree", "list", "--porcelain", cwd=main)
    found: dict[str, Registered] = {}
    for block in out.stdout.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, _, value = line.partition(" ")
            if key:
                fields[key] = value
        if "worktree" not in fields:
            continue
        found[os.path.realpath(fields["worktree"])] = Registered(
            branch=fields.get("branch", ""), prunable="prunable" in fields
        )
    return found


async def relation(
    git: GitRunner, path: str, head: str, target: str, worktree: tuple[str, str]
) -> Relation:
    """Where the session's ``head`` stands against the pull request's ``target``."""
    if head == target:
        return "same"
    if await is_ancestor(git, path, target, head, worktree):
        return "ahead"  # the session already contains the upstream head
    if head and await is_ancestor(git, path, head, target, worktree):
        return "behind"
    return "diverged"
