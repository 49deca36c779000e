"""The workspace manager: where a task's repository and session live on disk.

One persistent clone per repository, only ever cloned or fetched, and one git worktree
per issue or pull request on its own ``ccweb/<kind>-<n>`` branch. Nothing here resets,
cleans or overwrites: anything unexpected is reported as :class:`WorkspaceDirty` and left
exactly as it was for an administrator (task state ``blocked_workspace``).

The git it runs with Gitea lives in remote.py, the worktree mechanics in worktrees.py,
the checks in checks.py and the fetch rule in fetchrule.py.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Literal

from forgeflow.agent.jail import git_protected
from forgeflow.agent.jailrun import JailRunner
from forgeflow.domain.ids import RepoRef, ResourceKind, ResourceRef
from forgeflow.domain.paths import (
    SESSIONS_DIR,
    repo_sessions,
    repo_workspace,
    session_branch,
    session_worktree,
)
from forgeflow.workspace import remote, worktrees
from forgeflow.workspace.checks import Checks
from forgeflow.workspace.fetchrule import FetchRule
from forgeflow.workspace.git import (
    GitAuthFailed,
    GitFailed,
    GitRunner,
    GitTimeout,
    WorkspaceDirty,
    WorkspaceError,
    check_ref,
    check_sha,
    check_url,
)
from forgeflow.workspace.records import PullRequestRefs, RepoCheckout, SessionWorktree
from forgeflow.workspace.status import STATUS_ARGS, WorktreeStatus, parse_status

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

# What a look at a session's worktree found: the check's error (or None), the status.
_Look = tuple[BaseException | None, WorktreeStatus | BaseException]


def _is_empty_dir(path: str) -> bool:
    return os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path)


def _raise_first(look: _Look) -> WorktreeStatus:
    """The status of a look, or its first error: the check's verdict goes first, as a
    path that is not ours fails git status too."""
    checked, status = look
    for outcome in (checked, status):
        if isinstance(outcome, BaseException):
            raise outcome
    assert isinstance(status, WorktreeStatus)
    return status


class WorkspaceManager:
    """Clones, fetches and hands out worktrees below one root; never edits the clones."""

    def __init__(
        self,
        root: Path,
        *,
        token: str | None,
        git_timeout: float = 300.0,
        fetch_interval: float = 0.0,
        username: str = "forgeflow",
        on_spawn: Callable[[list[str], Mapping[str, str], asyncio.subprocess.Process], None]
        | None = None,
        jail: JailRunner | None = None,
    ) -> None:
        self.jail = jail  # where git on the agent's files runs (remove_session)
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
        self.fetch_rule = FetchRule(self.git, fetch_interval)
        self.checks = Checks(self.git)
        # A session's own checks, started beside the main clone's (both only read) and
        # picked up by prepare_session: the task waits for the slower, not for both.
        self._peeked: dict[str, asyncio.Task[_Look]] = {}

    # -- the main clone ------------------------------------------------------------------

    async def prepare_repo(
        self,
        repo: RepoRef,
        clone_url: str,
        default_branch: str,
        *,
        session: ResourceRef | None = None,
        branch_head: Callable[[], Awaitable[str | None]] | None = None,
    ) -> RepoCheckout:
        """Clone on first use, else check the clone is untouched and fetch it, unless the
        fetch rule (fetchrule.py) lets the task for ``session`` use it as it is;
        ``branch_head()`` is Gitea's answer for the default branch's head."""
        check_url(clone_url, "clone URL")
        check_ref(default_branch, "default branch")
        if session is not None and session.repo.key != repo.key:
            raise ValueError("the session belongs to another repository")
        path = repo_workspace(str(self.root), repo)
        async with self._lock(repo):
            self._inside_root(path)
            try:
                return await self._prepare_repo(
                    path, clone_url, default_branch, session, branch_head
                )
            except BaseException:
                # Whatever went wrong, the next task checks and fetches from scratch.
                self.fetch_rule.forget(path)
                self.checks.forget(path)
                if session is not None:
                    peek = self._peeked.pop(session_worktree(str(self.root), session), None)
                    if peek is not None:
                        peek.cancel()
                raise

    async def _prepare_repo(
        self,
        path: str,
        clone_url: str,
        branch: str,
        session: ResourceRef | None,
        branch_head: Callable[[], Awaitable[str | None]] | None,
    ) -> RepoCheckout:
        action: Literal["cloned", "fetched"]
        if os.path.lexists(path) and not _is_empty_dir(path):
            worktree = None if session is None else session_worktree(str(self.root), session)
            rule = worktree is not None and self.fetch_rule.interval > 0
            upstream: asyncio.Future[str | None] | None = None
            if rule and branch_head is not None and not os.path.isdir(str(worktree)):
                # A new worktree may skip the fetch if Gitea's head is the clone's: ask
                # Gitea while git checks the clone.
                upstream = asyncio.ensure_future(branch_head())
            try:
                await self._check_main_clone(path, clone_url, worktree)
            except BaseException:
                if upstream is not None:
                    upstream.cancel()
                raise
            if rule:
                exists = os.path.isdir(str(worktree))
                reused = await self.fetch_rule.reuse(path, branch, exists, upstream)
                if reused is not None:
                    return reused
            await self.git.run(
                "fetch", "--quiet", "--prune", "--no-recurse-submodules", "origin",
                cwd=path, auth=True,
            )  # fmt: skip
            action = "fetched"
        else:
            parent = os.path.dirname(path)
            os.makedirs(parent, mode=0o700, exist_ok=True)
            self._inside_root(parent)
            await remote.clone(self.git, path, clone_url)
            # Ours, from this URL, at this path: the next task need not ask git who it is.
            self.checks.trust(path, clone_url)
            action = "cloned"
        head = await remote.commit_of(self.git, path, f"refs/remotes/origin/{branch}")
        self.fetch_rule.record(path, branch, head)
        return RepoCheckout(path=path, action=action, head=head)

    async def _check_main_clone(self, path: str, clone_url: str, worktree: str | None) -> None:
        if worktree is not None:
            old = self._peeked.pop(worktree, None)
            if old is not None:
                old.cancel()
            if os.path.lexists(worktree):
                self._peeked[worktree] = asyncio.create_task(self._look(path, worktree))
        await self.checks.main_clone(path, clone_url)

    async def _look(self, main: str, path: str) -> _Look:
        """Is the session's worktree ours, and its status: both only read, so side by
        side; errors are returned (the check's verdict goes first)."""
        checked, status = await asyncio.gather(
            self.checks.session(main, path), self.worktree_status(path), return_exceptions=True
        )
        return checked, status

    # -- sessions ------------------------------------------------------------------------

    async def prepare_session(
        self,
        resource: ResourceRef,
        checkout: RepoCheckout,
        *,
        default_branch: str,
        pull: PullRequestRefs | None = None,
    ) -> SessionWorktree:
        """The session's worktree, created on first use and checked every time; a pull
        request's session follows its head when it can do so without touching work."""
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
        async with self._lock(resource.repo):
            self._inside_root(path)
            target = await remote.fetch_pull(self.git, main, pull) if pull else None
            peeked = self._peeked.pop(path, None)
            created = not os.path.lexists(path)
            if created:
                if peeked is not None:  # looked at before the path was gone
                    peeked.cancel()
                    peeked = None
                os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
                self._inside_root(os.path.dirname(path))
                start = target or checkout.head
                await worktrees.add_worktree(self.git, main, path, session_branch(resource), start)
            status = _raise_first(await (peeked or self._look(main, path)))
            if status.unmerged:
                raise WorkspaceDirty(
                    f"session worktree {path} has unmerged paths",
                    details={"path": path, "reason": "unmerged", "status": status.summary()},
                )
            return await self._follow(path, status, target, created)

    async def _follow(
        self, path: str, status: WorktreeStatus, target: str | None, created: bool
    ) -> SessionWorktree:
        """Fast-forward a clean session that is only behind the pull request's head; a
        session with work of its own is never touched: the prompt tells the agent."""
        moved = forwarded = False
        if target is not None:
            dirs = self._worktree_dirs(path)
            relation = await worktrees.relation(self.git, path, status.head, target, dirs)
            if relation == "behind" and status.clean:
                await self.git.run(
                    "merge", "--ff-only", "--no-edit", target, cwd=path, worktree=dirs
                )
                status = await self.worktree_status(path)
                forwarded = True
            elif relation in {"behind", "diverged"}:
                moved = True
        return SessionWorktree(
            path=path,
            branch=status.branch,
            status=status,
            upstream_moved=moved,
            fast_forwarded=forwarded,
            created=created,
        )

    async def worktree_status(self, path: str) -> WorktreeStatus:
        path = os.path.realpath(path)
        self._inside_root(path)
        return await self.checks.status(path, self._worktree_dirs(path))

    def _worktree_dirs(self, path: str) -> tuple[str, str]:
        """git's folders of a session worktree, from its clone's records (its own
        ``.git`` file is the agent's to rewrite)."""
        rel = os.path.relpath(path, os.path.join(self.root, SESSIONS_DIR))
        instance, owner, repo, _leaf = rel.split(os.sep)
        return self.checks.worktree_dirs(os.path.join(self.root, instance, owner, repo), path)

    async def remove_session(self, resource: ResourceRef) -> bool:
        """Remove a clean session worktree (its branch and commits stay); dirty → refuse.

        The worktree and the clone are the agent's files, so no git runs here on the
        host: the clean check is ``git status`` in a jail that binds the clone and the
        sessions folder read-only; the folder goes by ``rm -rf`` of that one entry in a
        jail binding only the repository's sessions folder (rm follows no symlink, and
        nothing outside that folder is in reach); git's bookkeeping of it is pruned in
        a jail with the clone writable (its config, hooks and info read-only) and the
        other sessions read-only, so their entries stay."""
        if self.jail is None:
            raise ValueError("removing a session worktree needs a jail runner")
        main = Path(repo_workspace(str(self.root), resource.repo))
        sessions_dir = Path(repo_sessions(str(self.root), resource.repo))
        path = Path(session_worktree(str(self.root), resource))
        async with self._lock(resource.repo):
            self._inside_root(str(path))
            if not main.is_dir() or not sessions_dir.is_dir():
                return False
            if not os.path.lexists(path):
                await self._jailed_prune(main, sessions_dir)
                return False
            status = await self._jailed_status(main, sessions_dir, path)
            if not status.clean:
                raise WorkspaceDirty(
                    f"session worktree {path} has uncommitted work; not removed",
                    details={
                        "path": str(path),
                        "reason": "uncommitted",
                        "status": status.summary(),
                    },
                )
            gone = await self.jail.run(
                ("rm", "-rf", "--one-file-system", "--", path.name),
                cwd=sessions_dir, writable=(sessions_dir,), timeout=self.git.timeout,
            )  # fmt: skip
            if gone.code != 0 or os.path.lexists(path):
                raise WorkspaceError(
                    f"session worktree {path} could not be removed",
                    details={"path": str(path), "reason": "remove_failed"},
                )
            await self._jailed_prune(main, sessions_dir)
            return True

    async def _jailed_status(self, main: Path, sessions_dir: Path, path: Path) -> WorktreeStatus:
        assert self.jail is not None
        limit = 4 * 1024 * 1024
        done = await self.jail.run(
            ("git", *STATUS_ARGS), cwd=path, readable=(main, sessions_dir),
            env={"GIT_OPTIONAL_LOCKS": "0"}, timeout=self.git.timeout, limit=limit,
        )  # fmt: skip
        if done.code != 0:
            raise WorkspaceDirty(
                f"{path} is taken by something that is not this session's worktree",
                details={"path": str(path), "reason": "occupied"},
            )
        if len(done.stdout) >= limit:  # cut: too much changed to read it all
            return WorktreeStatus(False, ["..."], [], [], "")
        return parse_status(done.stdout.decode("utf-8", "replace"))

    async def _jailed_prune(self, main: Path, sessions_dir: Path) -> None:
        assert self.jail is not None
        await self.jail.run(
            ("git", "worktree", "prune"), cwd=main, writable=(main,), readable=(sessions_dir,),
            protected=git_protected(main), timeout=self.git.timeout,
        )  # fmt: skip

    # -- publishing ----------------------------------------------------------------------

    async def local_head(self, repo: RepoRef, branch: str) -> str | None:
        """The commit of a session's local branch (branches live in the main clone)."""
        main = repo_workspace(str(self.root), repo)
        ref = f"refs/heads/{check_ref(branch, 'session branch')}"
        try:
            return await remote.commit_of(self.git, main, ref)
        except GitFailed:
            return None

    async def remote_head(self, repo: RepoRef, clone_url: str, branch: str) -> str | None:
        """Gitea's head of ``branch`` now (None: no such branch)."""
        main = repo_workspace(str(self.root), repo)
        return await remote.remote_head(self.git, main, clone_url, branch)

    async def contains(self, repo: RepoRef, sha: str, ref: str) -> bool:
        """Whether ``sha`` is already in ``ref`` of the main clone (nothing new in it)."""
        main = repo_workspace(str(self.root), repo)
        return await remote.is_ancestor(self.git, main, check_sha(sha, "commit"), ref)

    async def push(self, repo: RepoRef, clone_url: str, sha: str, branch: str) -> str | None:
        """Push ``sha`` to ``branch`` on Gitea, fast-forward only (remote.push). None when
        it landed, else git's reason, scrubbed."""
        main = repo_workspace(str(self.root), repo)
        async with self._lock(repo):
            return await remote.push(self.git, main, clone_url, sha, branch)

    async def branch_diff(self, repo: RepoRef, base: str, sha: str) -> str:
        """What ``sha`` changes since it left ``base`` (``git diff base...sha``): published
        work as a reviewer reads it. No external diff driver or text conversion runs:
        the repository's own attributes must not start programs here."""
        main = repo_workspace(str(self.root), repo)
        spec = f"{check_ref(base, 'base')}...{check_sha(sha, 'commit')}"
        args = ("diff", "--no-color", "--no-ext-diff", "--no-textconv", spec, "--")
        result = await self.git.run(*args, cwd=main, time_limit=30)
        return result.stdout

    # -- helpers -------------------------------------------------------------------------

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
