"""Workspace Manager (PRD FR-03, DESIGN "Workspaces").

One persistent clone per repository, only ever cloned or fetched, and one git worktree
per issue or pull request on its own ``ccweb/<kind>-<n>`` branch. Nothing here resets,
cleans or overwrites: anything unexpected is reported as :class:`WorkspaceDirty` and left
exactly as it was for an administrator (task state ``blocked_workspace``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from forgeflow.domain.ids import RepoRef, ResourceKind, ResourceRef
from forgeflow.domain.paths import repo_workspace, session_branch, session_worktree
from forgeflow.gitcmd import (
    GitAuthFailed,
    GitFailed,
    GitRunner,
    GitTimeout,
    WorkspaceDirty,
    WorkspaceError,
    check_ref,
    check_sha,
    check_url,
    same_origin,
    strip_userinfo,
)

__all__ = [
    "GitAuthFailed",
    "GitFailed",
    "GitTimeout",
    "PullRequestRefs",
    "RepoCheckout",
    "SessionWorktree",
    "WorkspaceDirty",
    "WorkspaceError",
    "WorkspaceManager",
    "WorktreeStatus",
]

_UNMERGED = frozenset({"DD", "AU", "UD", "UA", "DU", "AA", "UU"})
_SUMMARY_LIMIT = 20


@dataclass(frozen=True)
class RepoCheckout:
    path: str
    action: Literal["cloned", "fetched"]
    head: str  # sha of origin/<default branch> after the clone or fetch


@dataclass(frozen=True)
class PullRequestRefs:
    number: int
    base_ref: str
    head_ref: str
    head_sha: str
    head_clone_url: str  # the head may live in a fork


@dataclass(frozen=True)
class WorktreeStatus:
    clean: bool
    modified: list[str]
    untracked: list[str]
    unmerged: list[str]
    head: str

    def summary(self) -> dict[str, Any]:
        """A bounded, JSON-ready description for the audit log and the next prompt."""
        return {
            "clean": self.clean,
            "head": self.head,
            "counts": {
                "modified": len(self.modified),
                "untracked": len(self.untracked),
                "unmerged": len(self.unmerged),
            },
            "modified": self.modified[:_SUMMARY_LIMIT],
            "untracked": self.untracked[:_SUMMARY_LIMIT],
            "unmerged": self.unmerged[:_SUMMARY_LIMIT],
        }


@dataclass(frozen=True)
class SessionWorktree:
    path: str
    branch: str
    status: WorktreeStatus
    upstream_moved: bool
    fast_forwarded: bool = False
    created: bool = False


@dataclass(frozen=True)
class _Registered:
    branch: str
    prunable: bool


def _parse_status(out: str, head: str) -> WorktreeStatus:
    modified: list[str] = []
    untracked: list[str] = []
    unmerged: list[str] = []
    entries = out.split("\0")
    i = 0
    while i < len(entries):
        entry = entries[i]
        i += 1
        if len(entry) < 4:
            continue
        xy, path = entry[:2], entry[3:]
        if xy == "??":
            untracked.append(path)
        elif xy == "!!":
            continue
        elif xy in _UNMERGED:
            unmerged.append(path)
        else:
            modified.append(path)
            if "R" in xy or "C" in xy:
                i += 1  # with -z a rename/copy is followed by its source path
    clean = not (modified or untracked or unmerged)
    return WorktreeStatus(clean, modified, untracked, unmerged, head)


def _is_empty_dir(path: str) -> bool:
    return os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path)


class WorkspaceManager:
    """Clones, fetches and hands out worktrees below one root; never edits the clones."""

    def __init__(
        self,
        root: Path,
        *,
        token: str | None,
        git_timeout: float = 300.0,
        username: str = "forgeflow",
        on_spawn: Callable[[list[str], Mapping[str, str], asyncio.subprocess.Process], None]
        | None = None,
    ) -> None:
        # Resolved once, so that every later "is it under the root?" check compares
        # real paths with a real path.
        self.root = Path(os.path.realpath(root))
        self.git = GitRunner(
            root=str(self.root),
            token=token or None,
            username=username,
            timeout=git_timeout,
            on_spawn=on_spawn,
        )
        # The scheduler's repository lease already serialises work on one repository;
        # this lock only keeps two coroutines of this process off the same clone.
        self._locks: dict[str, asyncio.Lock] = {}

    # -- public API --------------------------------------------------------------------

    async def prepare_repo(
        self, repo: RepoRef, clone_url: str, default_branch: str
    ) -> RepoCheckout:
        check_url(clone_url, "clone URL")
        check_ref(default_branch, "default branch")
        path = repo_workspace(str(self.root), repo)
        async with self._lock(repo):
            self._inside_root(path)
            action: Literal["cloned", "fetched"]
            if os.path.lexists(path) and not _is_empty_dir(path):
                await self._check_main_clone(path, clone_url)
                await self.git.run(
                    "fetch",
                    "--quiet",
                    "--prune",
                    "--no-recurse-submodules",
                    "origin",
                    cwd=path,
                    auth=True,
                )
                action = "fetched"
            else:
                await self._clone(path, clone_url)
                action = "cloned"
            head = await self._commit(path, f"refs/remotes/origin/{default_branch}")
        return RepoCheckout(path=path, action=action, head=head)

    async def prepare_session(
        self,
        resource: ResourceRef,
        checkout: RepoCheckout,
        *,
        default_branch: str,
        pull: PullRequestRefs | None = None,
    ) -> SessionWorktree:
        main = repo_workspace(str(self.root), resource.repo)
        if os.path.realpath(checkout.path) != main:
            raise ValueError("checkout does not belong to this resource's repository")
        is_pull = resource.kind is ResourceKind.PULL_REQUEST
        if is_pull != (pull is not None):
            raise ValueError("pull request refs are required for, and only for, pull requests")
        if pull is not None and int(pull.number) != int(resource.number):
            raise ValueError("pull request refs belong to another pull request")
        check_ref(default_branch, "default branch")
        path = session_worktree(str(self.root), resource)
        branch = session_branch(resource)
        async with self._lock(resource.repo):
            self._inside_root(path)
            target = await self._fetch_pull(main, pull) if pull is not None else None
            registered = await self._worktrees(main)
            created = False
            if os.path.lexists(path):
                await self._check_ours(main, path, registered)
            else:
                if path in registered:
                    # Registered, but its directory is gone (deleted by hand): only the
                    # stale administrative entry is dropped; the branch and its commits
                    # stay and are checked out again below.
                    await self.git.run("worktree", "prune", cwd=main)
                await self._add_worktree(main, path, branch, target or checkout.head)
                created = True
            await self._check_index_lock(path)
            status = await self.worktree_status(path)
            if status.unmerged:
                raise WorkspaceDirty(
                    f"session worktree {path} has unmerged paths",
                    details={"path": path, "reason": "unmerged", "status": status.summary()},
                )
            upstream_moved = fast_forwarded = False
            if target is not None:
                relation = await self._relation(path, status.head, target)
                if relation == "behind" and status.clean:
                    await self.git.run("merge", "--ff-only", "--no-edit", target, cwd=path)
                    status = await self.worktree_status(path)
                    fast_forwarded = True
                elif relation in {"behind", "diverged"}:
                    # The agent's own work is never touched: the prompt tells it instead.
                    upstream_moved = True
            current = await self.git.run(
                "symbolic-ref", "--quiet", "--short", "HEAD", cwd=path, check=False
            )
            return SessionWorktree(
                path=path,
                branch=current.stdout.strip() if current.returncode == 0 else "HEAD",
                status=status,
                upstream_moved=upstream_moved,
                fast_forwarded=fast_forwarded,
                created=created,
            )

    async def worktree_status(self, path: str) -> WorktreeStatus:
        path = os.path.realpath(path)
        self._inside_root(path)
        head = await self.git.run("rev-parse", "--verify", "--quiet", "HEAD", cwd=path, check=False)
        out = await self.git.run(
            "status", "--porcelain=v1", "-z", "--untracked-files=all", "--ignored=no", cwd=path
        )
        return _parse_status(out.stdout, head.stdout.strip() if head.returncode == 0 else "")

    async def remove_session(self, resource: ResourceRef) -> bool:
        """Remove a clean session worktree (its branch and commits stay); dirty → refuse."""
        main = repo_workspace(str(self.root), resource.repo)
        path = session_worktree(str(self.root), resource)
        async with self._lock(resource.repo):
            self._inside_root(path)
            if not os.path.isdir(os.path.join(main, ".git")):
                return False
            registered = await self._worktrees(main)
            if not os.path.lexists(path):
                if path in registered:
                    await self.git.run("worktree", "prune", cwd=main)
                return False
            await self._check_ours(main, path, registered)
            await self._check_index_lock(path)
            status = await self.worktree_status(path)
            if not status.clean:
                raise WorkspaceDirty(
                    f"session worktree {path} has uncommitted work; not removed",
                    details={"path": path, "reason": "uncommitted", "status": status.summary()},
                )
            await self.git.run("worktree", "remove", "--", path, cwd=main)
            return True

    # -- main clone --------------------------------------------------------------------

    async def _clone(self, path: str, clone_url: str) -> None:
        # Cloned next to its final place and renamed in only when complete, so a clone
        # that failed or was killed at its time limit never leaves a half-clone that the
        # next attempt would have to call dirty. Validated names never start with ".",
        # so the staging name cannot collide with a repository.
        parent = os.path.dirname(path)
        os.makedirs(parent, mode=0o700, exist_ok=True)
        self._inside_root(parent)
        staging = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(path)}.clone-")
        try:
            await self.git.run(
                "clone", "--quiet", "--no-recurse-submodules", "--origin", "origin", "--",
                clone_url, staging, cwd=parent, auth=True,
            )  # fmt: skip
            try:
                os.rename(staging, path)  # replaces an empty directory, nothing else
            except OSError as exc:
                raise WorkspaceDirty(
                    f"{path} was taken while cloning",
                    details={"path": path, "reason": "occupied", "error": exc.strerror},
                ) from None
        finally:
            if os.path.isdir(staging):
                shutil.rmtree(staging, ignore_errors=True)

    async def _check_main_clone(self, path: str, clone_url: str) -> None:
        """Raise WorkspaceDirty unless ``path`` is our untouched clone of ``clone_url``."""
        gitdir = os.path.join(path, ".git")
        if os.path.islink(path) or not os.path.isdir(gitdir) or os.path.islink(gitdir):
            raise WorkspaceDirty(
                f"{path} exists but is not a forgeflow clone",
                details={"path": path, "reason": "not_a_clone"},
            )
        top = await self.git.run("rev-parse", "--show-toplevel", cwd=path, check=False)
        real = os.path.realpath(path)
        if top.returncode != 0 or os.path.realpath(top.stdout.strip()) != real:
            raise WorkspaceDirty(
                f"{path} exists but is not a forgeflow clone",
                details={"path": path, "reason": "not_a_clone"},
            )
        origin = await self.git.run("config", "--get", "remote.origin.url", cwd=path, check=False)
        found = origin.stdout.strip()
        if found.rstrip("/") != clone_url.rstrip("/"):
            raise WorkspaceDirty(
                f"{path} is a clone of another repository",
                details={
                    "path": path,
                    "reason": "other_origin",
                    "expected": clone_url,
                    "found": self.git.scrub(strip_userinfo(found)),
                },
            )
        reasons: list[str] = []
        if os.path.lexists(os.path.join(gitdir, "index.lock")):
            reasons.append("index_lock")
        status = await self.worktree_status(path)
        if status.unmerged:
            reasons.append("unmerged")
        if status.modified or status.untracked:
            reasons.append("modified")
        if reasons:
            raise WorkspaceDirty(
                f"the repository clone {path} was changed ({', '.join(reasons)}); "
                "nothing was fetched, reset or cleaned",
                details={"path": path, "reasons": reasons, "status": status.summary()},
            )

    # -- sessions ----------------------------------------------------------------------

    async def _fetch_pull(self, main: str, pull: PullRequestRefs) -> str:
        """Fetch the PR head (maybe from a fork) into a private ref; return the target."""
        head_url = check_url(pull.head_clone_url, "head clone URL")
        ref = check_ref(pull.head_ref, "head ref")
        if not ref.startswith("refs/"):
            ref = f"refs/heads/{ref}"
        sha = check_sha(pull.head_sha, "head sha")
        origin = await self.git.run("config", "--get", "remote.origin.url", cwd=main)
        # The bot's token goes only to the host we cloned from, never to a fork URL that
        # points somewhere else.
        auth = same_origin(head_url, urlsplit(origin.stdout.strip()))
        local = f"refs/forgeflow/pull/{int(pull.number)}/head"
        await self.git.run(
            "fetch", "--quiet", "--no-tags", "--no-recurse-submodules",
            "--no-write-fetch-head", "--", pull.head_clone_url, f"+{ref}:{local}",
            cwd=main, auth=auth,
        )  # fmt: skip
        have = await self.git.run("cat-file", "-e", f"{sha}^{{commit}}", cwd=main, check=False)
        if have.returncode == 0:
            return sha
        # The payload's head is gone (force-pushed since): the fetched tip is the head now.
        return await self._commit(main, local)

    async def _add_worktree(self, main: str, path: str, branch: str, start: str) -> None:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        self._inside_root(os.path.dirname(path))
        exists = await self.git.run(
            "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", cwd=main, check=False
        )
        if exists.returncode == 0:
            # The session's branch outlived its worktree (garbage-collected, or deleted
            # by hand): its commits are the session's work, so check it out as it is.
            await self.git.run("worktree", "add", "--", path, branch, cwd=main)
        else:
            await self.git.run(
                "worktree", "add", "--no-track", "-b", branch, "--", path, start, cwd=main
            )

    async def _check_ours(self, main: str, path: str, registered: dict[str, _Registered]) -> None:
        entry = registered.get(path)
        dot_git = os.path.join(path, ".git")
        ours = (
            entry is not None
            and not entry.prunable
            and not os.path.islink(path)
            and os.path.isfile(dot_git)
            and not os.path.islink(dot_git)
        )
        if ours:
            common = await self.git.run(
                "rev-parse", "--show-toplevel", "--git-common-dir", cwd=path, check=False
            )
            lines = common.stdout.splitlines()
            ours = (
                common.returncode == 0
                and len(lines) == 2
                and os.path.realpath(lines[0]) == os.path.realpath(path)
                and os.path.realpath(os.path.join(path, lines[1]))
                == os.path.realpath(os.path.join(main, ".git"))
            )
        if not ours:
            raise WorkspaceDirty(
                f"{path} is taken by something that is not this session's worktree",
                details={"path": path, "reason": "occupied"},
            )

    async def _check_index_lock(self, path: str) -> None:
        # A session is prepared before its turn starts, so no git of ours or of the agent
        # is running there: any index.lock is a leftover of a crash.
        lock = await self.git.run("rev-parse", "--git-path", "index.lock", cwd=path)
        if os.path.lexists(os.path.join(path, lock.stdout.strip())):
            raise WorkspaceDirty(
                f"session worktree {path} has a stale index.lock",
                details={"path": path, "reason": "index_lock"},
            )

    async def _relation(self, path: str, head: str, target: str) -> str:
        if head == target:
            return "same"
        if await self._is_ancestor(path, target, head):
            return "ahead"  # the session already contains the upstream head
        if head and await self._is_ancestor(path, head, target):
            return "behind"
        return "diverged"

    async def _is_ancestor(self, cwd: str, older: str, newer: str) -> bool:
        res = await self.git.run("merge-base", "--is-ancestor", older, newer, cwd=cwd, check=False)
        if res.returncode not in (0, 1):
            raise self.git.failure("git merge-base", res)
        return res.returncode == 0

    async def _worktrees(self, main: str) -> dict[str, _Registered]:
        out = await self.git.run("worktree", "list", "--porcelain", cwd=main)
        found: dict[str, _Registered] = {}
        for block in out.stdout.split("\n\n"):
            fields: dict[str, str] = {}
            for line in block.splitlines():
                key, _, value = line.partition(" ")
                if key:
                    fields[key] = value
            if "worktree" not in fields:
                continue
            found[os.path.realpath(fields["worktree"])] = _Registered(
                branch=fields.get("branch", ""), prunable="prunable" in fields
            )
        return found

    # -- helpers -----------------------------------------------------------------------

    async def _commit(self, cwd: str, ref: str) -> str:
        res = await self.git.run(
            "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", cwd=cwd, check=False
        )
        if res.returncode != 0:
            raise GitFailed(f"{ref} does not name a commit", details={"ref": ref})
        return res.stdout.strip()

    def _inside_root(self, path: str) -> None:
        # domain.paths already refuses names that escape the root; this also catches a
        # symlink planted inside the root that would lead git elsewhere.
        real = os.path.realpath(path)
        root = str(self.root)
        if os.path.commonpath([root, real]) != root:
            raise WorkspaceDirty(
                f"{path} resolves outside the workspace root",
                details={"path": path, "reason": "outside_root"},
            )

    def _lock(self, repo: RepoRef) -> asyncio.Lock:
        return self._locks.setdefault(repo.key, asyncio.Lock())
