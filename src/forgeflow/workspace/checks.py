"""Is it ours, and untouched? The checks behind ``workspace_dirty``.

"Dirty" means: the main clone was edited, a worktree has unmerged paths, a stale
``index.lock``, or a worktree path is taken by something that is not our worktree. A
session's own work in progress is not dirty. Each check runs as few git processes as
it can: on the way from a mention to its turn, starting a process costs more than
git's own work.
"""

from __future__ import annotations

import os

from forgeflow.workspace.git import GitRunner, WorkspaceDirty, strip_userinfo
from forgeflow.workspace.status import STATUS_ARGS, WorktreeStatus, parse_status


class Checks:
    def __init__(self, git: GitRunner) -> None:
        self.git = git
        # Per main clone: the clone URL its identity (top level, origin) was checked
        # against, and the stat of .git/config then; both live in that file, so a check
        # is repeated only when the file changed. The status is checked for every task.
        self._identity: dict[str, tuple[str, tuple[int, ...]]] = {}

    def forget(self, path: str) -> None:
        self._identity.pop(path, None)

    def trust(self, path: str, clone_url: str) -> None:
        """``path`` was just cloned from ``clone_url`` by this manager: its identity is
        known without asking git, until .git/config changes."""
        self._identity[path] = (clone_url, _identity_stamp(path))

    async def status(self, path: str, worktree: tuple[str, str] | None = None) -> WorktreeStatus:
        result = await self.git.run(*STATUS_ARGS, cwd=path, worktree=worktree)
        return parse_status(result.stdout)

    @staticmethod
    def worktree_dirs(main: str, path: str) -> tuple[str, str]:
        """The git folders of session worktree ``path`` of ``main`` as git's own files
        record them, for running git there without trusting the worktree's ``.git``
        file; WorkspaceDirty when they do not read plainly."""
        admin = _registered_admin_dir(main, path)
        if admin is None:
            raise WorkspaceDirty(
                f"{path} is taken by something that is not this session's worktree",
                details={"path": path, "reason": "occupied"},
            )
        return admin, os.path.realpath(os.path.join(main, ".git"))

    async def main_clone(self, path: str, clone_url: str) -> None:
        """Raise WorkspaceDirty unless ``path`` is our untouched clone of ``clone_url``."""
        gitdir = os.path.join(path, ".git")
        if os.path.islink(path) or not os.path.isdir(gitdir) or os.path.islink(gitdir):
            raise WorkspaceDirty(
                f"{path} exists but is not a forgeflow clone",
                details={"path": path, "reason": "not_a_clone"},
            )
        stamp = _identity_stamp(path)
        if self._identity.get(path) != (clone_url, stamp):
            await self._identity_of(path, clone_url)
            self._identity[path] = (clone_url, stamp)
        reasons: list[str] = []
        if os.path.lexists(os.path.join(gitdir, "index.lock")):
            reasons.append("index_lock")
        status = await self.status(path)
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

    async def _identity_of(self, path: str, clone_url: str) -> None:
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

    async def session(self, main: str, path: str) -> None:
        """Raise WorkspaceDirty unless ``path`` is a worktree of ``main`` registered at
        ``path`` ("occupied") without a stale ``index.lock``; at most one git process."""
        dot_git = os.path.join(path, ".git")
        admin = None
        if not os.path.islink(path) and os.path.isfile(dot_git) and not os.path.islink(dot_git):
            # git's own files answer the common case without a process; anything they
            # do not show plainly gets git's verdict.
            admin = _registered_admin_dir(main, path) or await self._admin_dir_by_git(main, path)
        if admin is None:
            raise WorkspaceDirty(
                f"{path} is taken by something that is not this session's worktree",
                details={"path": path, "reason": "occupied"},
            )
        # A session is prepared before its turn starts, so no git of ours or of the agent
        # is running there: any index.lock is a leftover of a crash.
        if os.path.lexists(os.path.join(admin, "index.lock")):
            raise WorkspaceDirty(
                f"session worktree {path} has a stale index.lock",
                details={"path": path, "reason": "index_lock"},
            )

    async def _admin_dir_by_git(self, main: str, path: str) -> str | None:
        found = await self.git.run(
            "rev-parse", "--show-toplevel", "--git-common-dir", "--absolute-git-dir",
            cwd=path, check=False,
        )  # fmt: skip
        lines = found.stdout.splitlines()
        ours = (
            found.returncode == 0
            and len(lines) == 3
            and os.path.realpath(lines[0]) == os.path.realpath(path)
            and os.path.realpath(os.path.join(path, lines[1]))
            == os.path.realpath(os.path.join(main, ".git"))
            # Registered at this very path (what `git worktree list` reads): the
            # administrative entry points back to this .git file, so it is neither
            # prunable nor a copy of another worktree.
            and _points_back(lines[2], os.path.join(path, ".git"))
        )
        return lines[2] if ours else None


def _identity_stamp(path: str) -> tuple[int, ...]:
    """The .git directory by its inode only (git adds files to it all the time) and
    .git/config, where the top level and origin live."""
    gitdir = os.path.join(path, ".git")
    return (os.stat(gitdir).st_ino, *_stat_key(os.path.join(gitdir, "config")))


def _stat_key(path: str) -> tuple[int, ...]:
    """Changes whenever the file is replaced or written (or vanishes)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return (-1,)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


def _registered_admin_dir(main: str, path: str) -> str | None:
    """The administrative directory of ``path`` when, by git's files alone
    (gitrepository-layout(5)), it is a worktree of ``main`` registered at this very
    path: ``path/.git`` names ``main/.git/worktrees/<id>``, whose ``commondir`` leads
    back to ``main/.git`` and whose ``gitdir`` points back to ``path/.git``. None when
    any of it is missing or reads otherwise (then git itself is asked)."""
    dot_git = os.path.join(path, ".git")
    common = os.path.realpath(os.path.join(main, ".git"))
    try:
        with open(dot_git, encoding="utf-8") as fh:
            first = fh.readline().strip()
        if not first.startswith("gitdir: "):
            return None
        admin = os.path.realpath(os.path.join(path, first.removeprefix("gitdir: ")))
        if os.path.dirname(admin) != os.path.join(common, "worktrees"):
            return None
        with open(os.path.join(admin, "commondir"), encoding="utf-8") as fh:
            recorded_common = fh.readline().strip()
        if os.path.realpath(os.path.join(admin, recorded_common)) != common:
            return None
        if not os.path.isfile(os.path.join(admin, "HEAD")):
            return None
    except (OSError, UnicodeDecodeError):
        return None
    return admin if _points_back(admin, dot_git) else None


def _points_back(admin_dir: str, dot_git: str) -> bool:
    try:
        with open(os.path.join(admin_dir, "gitdir"), encoding="utf-8") as fh:
            recorded = fh.read().strip()
    except OSError:
        return False
    return os.path.realpath(recorded) == os.path.realpath(dot_git)
