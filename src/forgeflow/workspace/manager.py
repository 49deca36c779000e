"""The workspace manager: where a task's repository and session live on disk.

Two repositories per repository, one per side of the jail (docs/security.md):

- forgeflow's bare **mirror** (mirror.py), outside every bind: the only repository its
  credentialed git (fetch, ls-remote, push with the bot's token) works in;
- the agent's **clone** ``<root>/default/<owner>/<repo>`` and one git worktree per issue
  or pull request on its own ``ccweb/<kind>-<n>`` branch: the jail's. Every git
  command on them runs inside that repository's jail (injail.py), and what it prints
  is untrusted.

Objects cross as data: a bundle made in the mirror goes into the jail on stdin
(delivery.py); a session's work comes out as a bundle on stdout, verified and fetched
in the mirror. One manager per process, shared by tasks and pipelines: its locks
(locks.py) order their git work on a repository.
Nothing here resets, cleans or overwrites the agent's trees: anything unexpected is
:class:`WorkspaceDirty` (task state ``blocked_workspace``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from forgeflow.agent.oneshot import JailRunner
from forgeflow.domain.ids import RepoRef, ResourceKind, ResourceRef
from forgeflow.domain.paths import (
    SESSIONS_DIR,
    repo_workspace,
    session_branch,
    session_worktree,
)
from forgeflow.workspace import injail, mirror, published
from forgeflow.workspace.delivery import CloneDeliveries, bundle_file
from forgeflow.workspace.fetchrule import FetchRule
from forgeflow.workspace.git import (
    GitAuthFailed,
    GitFailed,
    GitResult,
    GitRunner,
    GitTimeout,
    Spawn,
    WorkspaceDirty,
    WorkspaceError,
    check_ref,
    check_sha,
    check_url,
)
from forgeflow.workspace.injail import JailGit, Report
from forgeflow.workspace.locks import RepoLocks, Waiting
from forgeflow.workspace.records import PullRequestRefs, RepoCheckout, SessionWorktree
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


class WorkspaceManager:
    """Mirrors, clones and worktrees below one root; never edits the agent's work."""

    def __init__(
        self,
        root: Path,
        *,
        token: str | None,
        git_timeout: float = 300.0,
        fetch_interval: float = 0.0,
        username: str = "forgeflow",
        gitea_url: str | None = None,
        runner: JailRunner | None = None,
        on_spawn: Spawn | None = None,
        on_wait: Waiting | None = None,
    ) -> None:
        self.root = Path(os.path.realpath(root))
        self.git = GitRunner(
            root=str(self.root / mirror.MIRRORS_DIR),
            token=token or None,
            username=username,
            timeout=git_timeout,
            on_spawn=on_spawn,
            gitea_url=gitea_url,
        )
        self.jail = JailGit(runner or JailRunner(self.root), git_timeout)
        self.locks = RepoLocks(on_wait)
        self.fetch_rule = FetchRule(self.git, fetch_interval)
        self.clones = CloneDeliveries(self.root, self.git, self.jail)
        self._sessions: set[str] = set()  # worktrees this manager prepared (still there)

    @classmethod
    def from_settings(cls, settings: Any) -> WorkspaceManager:
        """The manager of a forgeflow's settings: its Gitea, token and jail."""
        token = settings.gitea_token.get_secret_value() if settings.gitea_token else None
        return cls(
            settings.resolved_workspace_root,
            token=token,
            fetch_interval=settings.fetch_interval_seconds,
            gitea_url=settings.gitea_url,
            runner=JailRunner.from_settings(settings),
        )

    def mirror(self, repo: RepoRef) -> str:
        return mirror.mirror_path(self.root, repo)

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
        """Bring the mirror up to date (unless the fetch rule lets this task skip it),
        then, in the jail, check the agent's clone and deliver the new objects (or make
        the clone from a bundle on first use)."""
        check_url(clone_url, "clone URL")
        check_ref(default_branch, "default branch")
        if session is not None and session.repo.key != repo.key:
            raise ValueError("the session belongs to another repository")
        async with self.locks.hold(repo, "prepare_repo"):
            try:
                return await self._prepare_repo(repo, clone_url, default_branch, session,
                                                branch_head)  # fmt: skip
            except BaseException:
                self.fetch_rule.forget(self.mirror(repo))
                self.clones.forget(repo)
                raise

    async def _prepare_repo(
        self,
        repo: RepoRef,
        clone_url: str,
        branch: str,
        session: ResourceRef | None,
        branch_head: Callable[[], Awaitable[str | None]] | None,
    ) -> RepoCheckout:
        path = self.mirror(repo)
        self.clones.origins[repo.key] = clone_url
        reused = None
        if not await mirror.ensure(self.git, path, clone_url, branch):
            if session is not None and self.fetch_rule.interval > 0:
                exists = session_worktree(str(self.root), session) in self._sessions
                upstream = asyncio.ensure_future(branch_head()) if branch_head else None
                reused = await self.fetch_rule.reuse(path, branch, exists, upstream)
            if reused is None:
                await mirror.fetch(self.git, path, clone_url, branch)
        head = await mirror.commit_of(self.git, path, f"refs/heads/{branch}")
        if head is None:
            raise GitFailed(f"Gitea has no branch {branch}", details={"branch": branch})
        cloned = await self.clones.deliver(repo, path, clone_url, defer=session is not None)
        self.fetch_rule.record(path, branch, head)
        clone = repo_workspace(str(self.root), repo)
        if reused is not None:
            return RepoCheckout(clone, "reused", head, reused.fetched_ago)
        return RepoCheckout(clone, "cloned" if cloned else "fetched", head)

    # -- sessions ------------------------------------------------------------------------

    async def prepare_session(
        self,
        resource: ResourceRef,
        checkout: RepoCheckout,
        *,
        default_branch: str,
        pull: PullRequestRefs | None = None,
        published_head: published.Lookup | None = None,
    ) -> SessionWorktree:
        """The session's worktree, created on first use and checked every time; a pull
        request's session follows its head when it can do so without touching work.
        ``published_head`` asks Gitea for an issue session's branch before it is fetched."""
        repo = resource.repo
        main = repo_workspace(str(self.root), repo)
        if os.path.realpath(checkout.path) != main:
            raise ValueError("checkout does not belong to this resource's repository")
        is_pull = resource.kind is ResourceKind.PULL_REQUEST
        if is_pull != (pull is not None):
            raise ValueError("pull request refs are required for, and only for, pull requests")
        if pull is not None and int(pull.number) != int(resource.number):
            raise ValueError("pull request refs belong to another pull request")
        check_ref(default_branch, "default branch")
        path = session_worktree(str(self.root), resource)
        async with self.locks.hold(repo, "prepare_session"):
            check = self.clones.take_deferred(repo)
            report, head = await self._session_step(repo, main, path, resource, checkout, pull,
                                                    check, published_head)  # fmt: skip
            if any(word.startswith("clone_") for word in report.words):
                # Not plainly ours and clean: the repo step, with a whole bundle, gives
                # its verdict (WorkspaceDirty) or delivers; then the session's step.
                self.clones.forget(repo)
                origin = self.clones.origins.get(repo.key)
                if origin is None:
                    raise GitFailed("the clone's check failed before any preparation")
                try:
                    await self.clones.deliver(repo, self.mirror(repo), origin, defer=False)
                except BaseException:
                    self.fetch_rule.forget(self.mirror(repo))  # the next task fetches
                    raise
                report, head = await self._session_step(repo, main, path, resource, checkout,
                                                        pull, False, published_head)  # fmt: skip
        status = published.verdict(report, path, session_branch(resource), head)
        self._sessions.add(path)
        return SessionWorktree(
            path=path,
            branch=status.branch,
            status=status,
            upstream_moved="moved" in report.words,
            fast_forwarded="forwarded" in report.words,
            created="created" in report.words,
            published=head,
        )

    async def _session_step(
        self, repo: RepoRef, main: str, path: str, resource: ResourceRef,
        checkout: RepoCheckout, pull: PullRequestRefs | None, check: bool,
        lookup: published.Lookup | None,
    ) -> tuple[Report, str | None]:  # fmt: skip
        """The session step in the jail; with the session branch's published head (an
        issue's, None: not published) that the worktree starts from and is checked
        against (published.py)."""
        start, number, mode, head = checkout.head, "", "", None
        mpath = self.mirror(repo)
        with bundle_file(mpath) as out:
            send = False
            if pull is None:
                fetch = checkout.action == "reused" and path not in self._sessions
                head, send = await published.bundle(
                    self.git, mpath, session_branch(resource), out,
                    origin=self.clones.origins.get(repo.key) if fetch else None,
                    known=self.clones.delivered.get(repo.key, set()), lookup=lookup,
                )  # fmt: skip
                start, mode = (head, "published") if head else (start, "")
            else:
                url = check_url(pull.head_clone_url, "head clone URL").geturl()
                origin = self.clones.origins.get(repo.key)
                start = await mirror.fetch_pull(self.git, mpath, origin or url, url,
                                                pull.head_ref, pull.number)  # fmt: skip
                if await mirror.has_commit(self.git, mpath, check_sha(pull.head_sha, "head sha")):
                    start = pull.head_sha.lower()
                number = str(int(pull.number))
                local = f"refs/forgeflow/pull/{number}/head"
                known = self.clones.delivered.get(repo.key, set())
                send = await mirror.bundle(self.git, mpath, out, [local], known)
            res = await self.jail.step(
                injail.SESSION_STEP, repo, main, main, path, session_branch(resource), start,
                number, "bundle" if send else "none", "check" if check else "", mode,
                stdin=Path(out) if send else None,
            )  # fmt: skip
        return injail.parse(res, "the session's preparation"), head

    async def worktree_status(self, path: str) -> WorktreeStatus:
        repo = self._repo_of(path)
        res = await self.jail.step(injail.STATUS_STEP, repo, path, path, read_only=True)
        report = injail.parse(res, "git status")
        if report.status is None:
            raise WorkspaceDirty(f"{path} {injail.DIRTY['occupied']}",
                                 details={"path": path, "reason": "occupied"})  # fmt: skip
        return report.status

    def _repo_of(self, path: str) -> RepoRef:
        """The repository of a session worktree path (one that forgeflow computed)."""
        rel = os.path.relpath(os.path.normpath(path), self.root / SESSIONS_DIR)
        parts = rel.split(os.sep)
        if len(parts) != 4 or parts[0] == "..":
            raise ValueError(f"{path} is not a session worktree of this workspace")
        return RepoRef(parts[1], parts[2])

    def working(self, repo: RepoRef) -> contextlib.AbstractAsyncContextManager[None]:
        """Entered by a task for its life in the repository (preparation, turn, push):
        a session's removal waits until no task works there (locks.py)."""
        return self.locks.working(repo)

    async def remove_session(self, resource: ResourceRef) -> bool:
        """Remove a clean session worktree (its branch and commits stay); dirty → refuse.
        Waits for the tasks working in the repository."""
        repo = resource.repo
        main = repo_workspace(str(self.root), repo)
        path = session_worktree(str(self.root), resource)
        async with self.locks.when_idle(repo, "remove_session"):
            res = await self.jail.step(injail.REMOVE_STEP, repo, main, main, path)
        report = injail.parse(res, "the session's removal")
        if "dirty" in report.words:
            raise WorkspaceDirty(
                f"session worktree {path} has uncommitted work; not removed",
                details={"path": path, "reason": "uncommitted",
                         "status": report.status.summary() if report.status else None},
            )  # fmt: skip
        if "occupied" in report.words:
            raise WorkspaceDirty(f"{path} {injail.DIRTY['occupied']}",
                                 details={"path": path, "reason": "occupied"})  # fmt: skip
        self._sessions.discard(path)
        return "removed" in report.words

    # -- publishing ----------------------------------------------------------------------

    async def local_head(self, repo: RepoRef, branch: str) -> str | None:
        """The commit of a session's local branch, as the jail tells it."""
        main = repo_workspace(str(self.root), repo)
        ref = f"refs/heads/{check_ref(branch, 'session branch')}"
        try:
            return await self.jail.head(repo, main, ref)
        except GitFailed:
            return None

    async def remote_head(self, repo: RepoRef, clone_url: str, branch: str) -> str | None:
        """Gitea's head of ``branch`` now (None: no such branch); from the mirror."""
        ref = f"refs/heads/{check_ref(branch, 'branch')}"
        out = await self.git.run(
            "ls-remote", "--", check_url(clone_url, "clone URL").geturl(), ref,
            cwd=self._mirror_dir(repo), auth=True,
        )  # fmt: skip
        first = out.stdout.split()
        return check_sha(first[0], "remote head") if first else None

    async def contains(self, repo: RepoRef, sha: str, branch: str) -> bool:
        """Whether ``sha`` is already in the mirror's ``branch`` (nothing new in it)."""
        path = self._mirror_dir(repo)
        if not await mirror.has_commit(self.git, path, sha):
            return False
        ref = f"refs/heads/{check_ref(branch, 'branch')}"
        res = await self.git.run("merge-base", "--is-ancestor", sha, ref, cwd=path, check=False)
        if res.returncode not in (0, 1):
            raise self.git.failure("git merge-base", res)
        return res.returncode == 0

    async def push(
        self, repo: RepoRef, clone_url: str, sha: str, branch: str, *, local: str | None = None
    ) -> str | None:
        """Take ``sha`` of the session's ``local`` branch out of the jail as a bundle,
        verify and fetch it into the mirror, and push it to ``branch`` from there,
        fast-forward only. None when it landed, else git's output (for the log)."""
        sha = check_sha(sha, "commit")
        check_ref(branch, "branch")
        path = self._mirror_dir(repo)
        private = f"refs/forgeflow/publish/{branch}"
        default = await self.git.run("symbolic-ref", "--quiet", "HEAD", cwd=path, check=False)
        if default.stdout.strip() == f"refs/heads/{branch}":
            # The publisher never targets it either; this keeps it so whatever calls.
            return "forgeflow refuses to push to the default branch"
        async with self.locks.hold(repo, "push"):
            if not await mirror.has_commit(self.git, path, sha):
                await self._take(repo, path, check_ref(local or branch, "session branch"), sha,
                                 private)  # fmt: skip
            refused = await mirror.push(self.git, path, clone_url, sha, branch)
            if refused is not None:
                # Gitea's branch moved (or says no): the mirror learns its head, so the
                # next preparation compares with it even if it skips the fetch.
                with contextlib.suppress(WorkspaceError):
                    await published.fetch_branch(self.git, path, clone_url, branch)
            return refused

    async def _take(self, repo: RepoRef, path: str, local: str, sha: str, private: str) -> None:
        main = repo_workspace(str(self.root), repo)
        ref = f"refs/heads/{local}"
        with bundle_file(path) as out:
            res = await self.jail.step(injail.BUNDLE_STEP, repo, main, main, ref,
                                       limit=injail.BUNDLE_LIMIT, read_only=True)  # fmt: skip
            if res.returncode != 0 or res.truncated or res.timed_out:
                raise GitFailed("the session's commits could not be read out of the jail")
            Path(out).write_bytes(res.stdout)  # a fresh name in forgeflow's folder
            await mirror.take_bundle(self.git, path, out, ref, sha, private)

    async def branch_diff(self, repo: RepoRef, base: str, sha: str, *, limit: int) -> GitResult:
        """What a published ``sha`` changes since it left ``base`` (mirror.branch_diff)."""
        return await mirror.branch_diff(self.git, self._mirror_dir(repo), base, sha, limit=limit)

    async def diff_since(self, repo: RepoRef, old: str, new: str, *, limit: int) -> str | None:
        """``git diff old new`` in the mirror (its first ``limit`` bytes) when ``old`` is
        an ancestor of ``new``, else None (mirror.diff_since; a re-review's prompt,
        tasks/review_prompt.py)."""
        return await mirror.diff_since(self.git, self._mirror_dir(repo), old, new, limit=limit)

    # -- helpers -------------------------------------------------------------------------

    def _mirror_dir(self, repo: RepoRef) -> str:
        path = self.mirror(repo)
        if not os.path.isdir(path):
            raise GitFailed(f"no mirror of {repo.key} yet", details={"repo": repo.key})
        return path
