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
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from forgeflow.domain.ids import RepoRef, ResourceKind, ResourceRef
from forgeflow.domain.paths import (
    SESSIONS_DIR,
    repo_workspace,
    session_branch,
    session_worktree,
)
from forgeflow.workspace.checks import Checks
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
    same_origin,
)
from forgeflow.workspace.status import WorktreeStatus

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


@dataclass(frozen=True)
class _Registered:
    branch: str
    prunable: bool


# What a look at a session's worktree found: the check's error (or None), the status.
_Look = tuple[BaseException | None, WorktreeStatus | BaseException]


@dataclass(frozen=True)
class _Fetched:
    """The last clone or fetch of a main clone by this manager."""

    at: float  # time.monotonic()
    branch: str
    head: str


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
        fetch_interval: float = 0.0,
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
        # DESIGN "Workspaces", fetch rule: a task whose session worktree exists skips the
        # fetch when this manager fetched the clone less than ``fetch_interval`` seconds
        # ago (0: fetch for every task).
        self.fetch_interval = fetch_interval
        self._fetched: dict[str, _Fetched] = {}
        self.checks = Checks(self.git)
        # A session's own checks, started beside the main clone's (both only read) and
        # picked up by prepare_session: the task waits for the slower, not for both.
        self._peeked: dict[str, asyncio.Task[_Look]] = {}

    # -- public API --------------------------------------------------------------------

    async def prepare_repo(
        self,
        repo: RepoRef,
        clone_url: str,
        default_branch: str,
        *,
        session: ResourceRef | None = None,
        branch_head: Callable[[], Awaitable[str | None]] | None = None,
    ) -> RepoCheckout:
        """Clone on first use, else check the clone is untouched and fetch it.

        With ``session`` (the issue or pull request the clone is prepared for) and a
        ``fetch_interval`` above 0, the fetch is skipped ("reused") when

        - that session's worktree exists and this manager fetched the clone less than
          ``fetch_interval`` seconds ago: such a task uses no fetched ref (its branch
          exists); or
        - the worktree is new and ``branch_head()`` (Gitea's answer) names the commit
          ``origin/<default branch>`` already is: the new branch starts from the
          current head either way.
        """
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
                self._fetched.pop(path, None)
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
            upstream: asyncio.Future[str | None] | None = None
            if (
                session is not None
                and self.fetch_interval > 0
                and branch_head is not None
                and not os.path.isdir(session_worktree(str(self.root), session))
            ):
                # A new worktree may skip the fetch if Gitea's head is the clone's: ask
                # Gitea while git checks the clone.
                upstream = asyncio.ensure_future(branch_head())
            try:
                await self._check_main_clone(path, clone_url, session)
            except BaseException:
                if upstream is not None:
                    upstream.cancel()
                raise
            if session is not None and self.fetch_interval > 0:
                reused = await self._reuse(path, branch, session, upstream)
                if reused is not None:
                    return reused
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
        head = await self._commit(path, f"refs/remotes/origin/{branch}")
        self._fetched[path] = _Fetched(time.monotonic(), branch, head)
        return RepoCheckout(path=path, action=action, head=head)

    async def _check_main_clone(
        self, path: str, clone_url: str, session: ResourceRef | None
    ) -> None:
        worktree = session_worktree(str(self.root), session) if session is not None else None
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

    async def _reuse(
        self,
        path: str,
        branch: str,
        session: ResourceRef,
        upstream: asyncio.Future[str | None] | None,
    ) -> RepoCheckout | None:
        """The clone as it is, when the fetch rule lets this task skip the fetch."""
        last = self._fetched.get(path)
        now = time.monotonic()
        if os.path.isdir(session_worktree(str(self.root), session)):
            if upstream is not None:
                upstream.cancel()
            if last is not None and last.branch == branch and now - last.at < self.fetch_interval:
                return RepoCheckout(path, "reused", last.head, now - last.at)
            return None
        head = await upstream if upstream is not None else None
        if not head:
            return None
        if last is not None and last.branch == branch:
            # Only this manager fetches the clone, under its lock: the head it recorded
            # is still the clone's, without a git process to ask.
            ours = last.head
        else:
            ours = (
                await self.git.run(
                    "rev-parse", "--verify", "--quiet",
                    f"refs/remotes/origin/{branch}^{{commit}}", cwd=path, check=False,
                )
            ).stdout.strip()  # fmt: skip
        if ours != head:
            return None
        ago = now - last.at if last is not None else float("inf")
        return RepoCheckout(path, "reused", head, ago)

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
            created = False
            peeked = self._peeked.pop(path, None)
            if os.path.lexists(path):
                checked, status = await (peeked or self._look(main, path))
                # The check's verdict first: a path that is not ours fails git status too.
                for outcome in (checked, status):
                    if isinstance(outcome, BaseException):
                        raise outcome
                assert isinstance(status, WorktreeStatus)
            else:
                if peeked is not None:
                    peeked.cancel()
                await self._add_worktree(main, path, branch, target or checkout.head)
                created = True
                checked, status = await self._look(main, path)
                for outcome in (checked, status):
                    if isinstance(outcome, BaseException):
                        raise outcome
                assert isinstance(status, WorktreeStatus)
            if status.unmerged:
                raise WorkspaceDirty(
                    f"session worktree {path} has unmerged paths",
                    details={"path": path, "reason": "unmerged", "status": status.summary()},
                )
            upstream_moved = fast_forwarded = False
            if target is not None:
                relation = await self._relation(path, status.head, target)
                if relation == "behind" and status.clean:
                    await self.git.run(
                        "merge", "--ff-only", "--no-edit", target,
                        cwd=path, worktree=self._worktree_dirs(path),
                    )  # fmt: skip
                    status = await self.worktree_status(path)
                    fast_forwarded = True
                elif relation in {"behind", "diverged"}:
                    # The agent's own work is never touched: the prompt tells it instead.
                    upstream_moved = True
            return SessionWorktree(
                path=path,
                branch=status.branch,
                status=status,
                upstream_moved=upstream_moved,
                fast_forwarded=fast_forwarded,
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
        """Remove a clean session worktree (its branch and commits stay); dirty → refuse."""
        main = repo_workspace(str(self.root), resource.repo)
        path = session_worktree(str(self.root), resource)
        async with self._lock(resource.repo):
            self._inside_root(path)
            if not os.path.isdir(os.path.join(main, ".git")):
                return False
            if not os.path.lexists(path):
                if path in await self._worktrees(main):
                    await self.git.run("worktree", "prune", cwd=main)
                return False
            await self.checks.session(main, path)
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
            # Ours, from this URL, at this path: the next task need not ask git who it is.
            self.checks.trust(path, clone_url)
        finally:
            if os.path.isdir(staging):
                shutil.rmtree(staging, ignore_errors=True)

    # -- publishing --------------------------------------------------------------------

    async def local_head(self, repo: RepoRef, branch: str) -> str | None:
        """The commit of a session's local branch (branches live in the main clone)."""
        main = repo_workspace(str(self.root), repo)
        ref = f"refs/heads/{check_ref(branch, 'session branch')}"
        try:
            return await self._commit(main, ref)
        except GitFailed:
            return None

    async def remote_head(self, repo: RepoRef, clone_url: str, branch: str) -> str | None:
        """Gitea's head of ``branch`` now (None: no such branch)."""
        main = repo_workspace(str(self.root), repo)
        ref = f"refs/heads/{check_ref(branch, 'branch')}"
        out = await self.git.run(
            "ls-remote", "--", check_url(clone_url, "clone URL").geturl(), ref,
            cwd=main, auth=True,
        )  # fmt: skip
        first = out.stdout.split()
        return check_sha(first[0], "remote head") if first else None

    async def contains(self, repo: RepoRef, sha: str, ref: str) -> bool:
        """Whether ``sha`` is already in ``ref`` of the main clone (nothing new in it)."""
        main = repo_workspace(str(self.root), repo)
        return await self._ancestor(main, check_sha(sha, "commit"), ref)

    async def push(self, repo: RepoRef, clone_url: str, sha: str, branch: str) -> str | None:
        """Push ``sha`` to ``branch`` on Gitea, fast-forward only (no force, ever); from
        the main clone to the clone URL we know, not to what its config says. None when
        it landed, else git's reason, scrubbed."""
        main = repo_workspace(str(self.root), repo)
        spec = f"{check_sha(sha, 'commit')}:refs/heads/{check_ref(branch, 'branch')}"
        async with self._lock(repo):
            res = await self.git.run(
                "push", "--porcelain", "--no-verify", "--",
                check_url(clone_url, "clone URL").geturl(), spec,
                cwd=main, auth=True, check=False,
            )  # fmt: skip
        if res.returncode == 0:
            return None
        lines = [ln for ln in (res.stdout + "\n" + res.stderr).splitlines() if ln.strip()]
        reasons = [ln for ln in lines if ln.startswith(("!", "remote:", "error:", "fatal:"))]
        return "; ".join(reasons or lines[-3:])[:1000] or f"git push exited {res.returncode}"

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
        # The common case (a new branch) in one git process; git's refusal (LC_ALL=C)
        # says when the branch or a stale registration is already there.
        new_branch = ("--no-track", "-b", branch, "--", path, start)
        args: tuple[str, ...] = new_branch
        for _ in range(3):
            res = await self.git.run("worktree", "add", *args, cwd=main, check=False)
            if res.returncode == 0:
                return
            if "is a missing but already registered worktree" in res.stderr:
                # Registered, but its directory is gone (deleted by hand): only the stale
                # administrative entry is dropped; the branch and its commits stay.
                await self.git.run("worktree", "prune", cwd=main)
            elif args == new_branch and f"a branch named '{branch}' already exists" in res.stderr:
                # The session's branch outlived its worktree (garbage-collected, or
                # deleted by hand): its commits are the session's work, so check it out
                # as it is.
                args = ("--", path, branch)
            else:
                break
        raise self.git.failure("git worktree add", res)

    async def _relation(self, path: str, head: str, target: str) -> str:
        if head == target:
            return "same"
        if await self._is_ancestor(path, target, head):
            return "ahead"  # the session already contains the upstream head
        if head and await self._is_ancestor(path, head, target):
            return "behind"
        return "diverged"

    async def _is_ancestor(self, cwd: str, older: str, newer: str) -> bool:
        res = await self.git.run(
            "merge-base", "--is-ancestor", older, newer,
            cwd=cwd, check=False, worktree=self._worktree_dirs(cwd),
        )  # fmt: skip
        if res.returncode not in (0, 1):
            raise self.git.failure("git merge-base", res)
        return res.returncode == 0

    async def _ancestor(self, main: str, older: str, newer: str) -> bool:
        res = await self.git.run("merge-base", "--is-ancestor", older, newer, cwd=main, check=False)
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
