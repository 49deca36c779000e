"""A session's published branch: the part of a session that outlives its worker.

An issue's session publishes its local branch ``ccweb/issue-<n>`` to the branch of the
same name on Gitea (domain/publish.py). That branch is what another worker, a lost
workspace folder or a removed worktree still has: a session whose branch exists on
Gitea gets its worktree from it, never from the default branch. The mirror's fetch
brings every branch; a task that skipped the fetch (the fetch rule) and has no worktree
here fetches just the session's branch (one ref, bounded refspec). The session step
(injail.py) then compares the local branch with the published head:

- the same, or local ahead (commits not pushed yet): nothing to do;
- local behind, on the branch and clean: fast-forwarded to the published head;
- local behind with work in the worktree, or diverged: :class:`WorkspaceDirty`
  (``blocked_workspace``) naming both heads; nothing is reset.

A pull request's session follows its head as before (``upstream_moved``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from forgeflow.workspace import mirror
from forgeflow.workspace.git import (
    GitFailed,
    GitRunner,
    WorkspaceDirty,
    check_ref,
    check_sha,
    check_url,
)
from forgeflow.workspace.injail import DIRTY, Report
from forgeflow.workspace.status import WorktreeStatus

# git's words when the remote has no such ref (LC_ALL=C, see git.py)
_NO_REF = "couldn't find remote ref"


@dataclass(frozen=True)
class Said:
    """What Gitea's API says of the session branch: its head, None when Gitea has no
    such branch."""

    head: str | None


# Asked before a fetch of the session branch alone: a request on the client's kept
# connections costs milliseconds, where a git fetch that finds nothing costs a process
# and a smart-HTTP exchange (≈ 0.1–0.2 s a new session). None: Gitea cannot say.
Lookup = Callable[[], Awaitable[Said | None]]


async def fetch_branch(git: GitRunner, path: str, clone_url: str, branch: str) -> str | None:
    """Gitea's ``branch`` alone into the mirror's branch of that name; its commit, or
    None when Gitea has no such branch (the mirror's copy, if any, is left to the next
    whole fetch, which prunes)."""
    ref = f"refs/heads/{check_ref(branch, 'session branch')}"
    res = await git.run(
        "fetch", "--quiet", "--no-tags", "--no-recurse-submodules", "--no-write-fetch-head",
        "--", check_url(clone_url, "clone URL").geturl(), f"+{ref}:{ref}",
        cwd=path, auth=True, check=False,
    )  # fmt: skip
    if res.returncode != 0:
        if _NO_REF in res.stderr.lower():
            return None
        raise git.failure("git fetch", res)
    return await mirror.commit_of(git, path, ref)


async def head(git: GitRunner, path: str, branch: str) -> str | None:
    """The mirror's commit of the session's published branch (None: not published)."""
    return await mirror.commit_of(git, path, f"refs/heads/{check_ref(branch, 'session branch')}")


async def fresh_head(
    git: GitRunner, path: str, origin: str, branch: str, lookup: Lookup | None
) -> str | None:
    """The session branch's head on Gitea, fetched alone into the mirror unless Gitea's
    API says there is no such branch or the mirror already has its head."""
    said = await lookup() if lookup is not None else None
    if said is not None:
        if said.head is None:
            return None
        if said.head.lower() == await head(git, path, branch):
            return said.head.lower()
    return await fetch_branch(git, path, origin, branch)


async def bundle(
    git: GitRunner, path: str, branch: str, out: str, *,
    origin: str | None, known: set[str], lookup: Lookup | None = None,
) -> tuple[str | None, bool]:  # fmt: skip
    """The session branch's head on Gitea as the mirror ``path`` has it (brought up to
    date from ``origin`` when given: the task skipped the fetch and no worktree is
    known), and whether a bundle of it, without ``known`` (what the clone has), was
    written to ``out`` (False: nothing to send)."""
    if origin is not None:
        sha = await fresh_head(git, path, origin, branch, lookup)
    else:
        sha = await head(git, path, branch)
    if sha is None:
        return None, False
    return sha, await mirror.bundle(git, path, out, [f"refs/heads/{branch}"], known)


def verdict(report: Report, path: str, branch: str, published: str | None) -> WorktreeStatus:
    """The session step's verdict: its worktree's status, or the refusal it reported."""
    for word in ("occupied", "index_lock", "no_target", "fetch_failed", "add_failed"):
        if word in report.words:
            if word in DIRTY:
                raise WorkspaceDirty(f"{path} {DIRTY[word]}",
                                     details={"path": path, "reason": word})  # fmt: skip
            raise GitFailed(f"the session's preparation failed in the jail ({word})")
    status = report.status
    if status is None:
        raise GitFailed("the session's preparation printed no status")
    if status.unmerged:
        raise WorkspaceDirty(
            f"session worktree {path} has unmerged paths",
            details={"path": path, "reason": "unmerged", "status": status.summary()},
        )
    if published is not None:
        _check(report, path, branch, published)
    return status


def _check(report: Report, path: str, branch: str, published: str) -> None:
    """The session step's word on the local branch against the published head: a
    :class:`WorkspaceDirty` naming both when the session cannot simply go on."""
    for word, why in (
        ("diverged", "has diverged from"),
        ("behind", "is behind, with work in its worktree,"),
    ):
        if word not in report.words:
            continue
        local = _sha_or_none(report.words[word])
        raise WorkspaceDirty(
            f"the session branch {branch} ({local or 'missing'}) {why} the branch published "
            f"on Gitea ({published}); nothing was reset",
            details={"path": path, "reason": word, "branch": branch,
                     "localHead": local, "publishedHead": published},
        )  # fmt: skip


def _sha_or_none(value: str) -> str | None:
    """The jail's word for the local head: the agent's to forge, so only a commit id
    (which misleads about nothing but its own branch) is named."""
    try:
        return check_sha(value.strip(), "local head")
    except GitFailed:
        return None
