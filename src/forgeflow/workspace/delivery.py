"""What crosses from forgeflow's mirror into the agent's clone, and what the manager
remembers of it.

Objects cross as data: a bundle made in the mirror goes into the jail on stdin, where
the repo step (injail.py) checks the clone and fetches the bundle (or makes the clone
from it on first use). Per repository the manager remembers the mirror's branch tips
last delivered, so the next delivery bundles only what the clone lacks; a restart
forgets them, and the next delivery is a whole bundle.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from forgeflow.domain.ids import RepoRef
from forgeflow.domain.paths import repo_workspace
from forgeflow.workspace import injail, mirror
from forgeflow.workspace.git import GitFailed, GitRunner, WorkspaceDirty
from forgeflow.workspace.injail import JailGit, Report


@contextlib.contextmanager
def bundle_file(path: str) -> Iterator[str]:
    """A fresh file name beside the mirror ``path`` (forgeflow's folder, never bound)."""
    fd, name = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".bundle-")
    os.close(fd)
    os.unlink(name)  # git bundle create writes it anew
    try:
        yield name
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


class CloneDeliveries:
    """The repo step of every clone below ``root``, and what each one was given."""

    def __init__(self, root: Path, git: GitRunner, jail: JailGit) -> None:
        self.root = root
        self.git = git
        self.jail = jail
        self.delivered: dict[str, set[str]] = {}  # repo key → tips in its clone
        self.origins: dict[str, str] = {}  # the clone URL each mirror is fetched from
        self.deferred: set[str] = set()  # clones whose check the session's step makes

    def forget(self, repo: RepoRef) -> None:
        """The next delivery is a whole bundle (something went wrong on the way)."""
        self.delivered.pop(repo.key, None)

    def take_deferred(self, repo: RepoRef) -> bool:
        """Whether the session's step must check the clone (and it is then done)."""
        deferred = repo.key in self.deferred
        self.deferred.discard(repo.key)
        return deferred

    async def deliver(self, repo: RepoRef, path: str, clone_url: str, *, defer: bool) -> bool:
        """The repo step in the jail, with a bundle of what the clone lacks; True when
        the clone was made now. With nothing to deliver and a session to prepare next
        (``defer``), the clone's check runs in the session's jail instead."""
        clone = repo_workspace(str(self.root), repo)
        tips = await mirror.tips(self.git, path)
        known = self.delivered.get(repo.key)
        if defer and known is not None and tips == known:
            self.deferred.add(repo.key)
            return False
        self.deferred.discard(repo.key)
        report = await self._repo_step(repo, path, clone, clone_url, tips, known)
        if report.words.keys() & {"need_bundle", "fetch_failed"} and known is not None:
            report = await self._repo_step(repo, path, clone, clone_url, tips, None)
        for word in ("clone_failed", "fetch_failed"):
            if word in report.words:
                raise GitFailed(f"the {word.split('_')[0]} of {clone} failed in the jail")
        _check_clean(clone, report)
        self.delivered[repo.key] = tips
        return "cloned" in report.words

    async def _repo_step(
        self, repo: RepoRef, path: str, clone: str, clone_url: str, tips: set[str],
        known: set[str] | None,
    ) -> Report:  # fmt: skip
        with bundle_file(path) as out:
            refs = ["HEAD", "--branches"]
            send = tips != known and await mirror.bundle(self.git, path, out, refs, known or set())
            res = await self.jail.step(
                injail.REPO_STEP, repo, clone, clone, "bundle" if send else "none", clone_url,
                stdin=Path(out) if send else None,
            )  # fmt: skip
        return injail.parse(res, "the clone's check")


def _check_clean(clone: str, report: Report) -> None:
    """Nothing delivered into a clone someone changed: :class:`WorkspaceDirty`."""
    reasons: list[str] = [
        w for w in ("not_a_clone", "need_bundle", "index_lock") if w in report.words
    ]
    status = report.status
    if status is not None and status.unmerged:
        reasons.append("unmerged")
    if status is not None and (status.modified or status.untracked):
        reasons.append("modified")
    if reasons:
        raise WorkspaceDirty(
            f"the repository clone {clone} was changed ({', '.join(reasons)}); "
            "nothing was fetched, reset or cleaned",
            details={"path": clone, "reason": reasons[0], "reasons": [*reasons],
                     "status": status.summary() if status else None},
        )  # fmt: skip
