"""What a workspace exchanges with Gitea through git: the first clone of a repository, a
pull request's head (maybe from a fork), a branch's head on Gitea, and the push of a
session's work.

Credentials go only to the host the clone came from, and only on the calls that need
them (``auth=True``); git gets them through ``GIT_ASKPASS`` (git.py).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from urllib.parse import urlsplit

from forgeflow.workspace.git import (
    GitFailed,
    GitRunner,
    WorkspaceDirty,
    check_ref,
    check_sha,
    check_url,
    same_origin,
)
from forgeflow.workspace.records import PullRequestRefs


async def commit_of(git: GitRunner, cwd: str, ref: str) -> str:
    """The commit ``ref`` names in the repository at ``cwd``; GitFailed when none."""
    res = await git.run(
        "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", cwd=cwd, check=False
    )
    if res.returncode != 0:
        raise GitFailed(f"{ref} does not name a commit", details={"ref": ref})
    return res.stdout.strip()


async def is_ancestor(
    git: GitRunner, cwd: str, older: str, newer: str, worktree: tuple[str, str] | None = None
) -> bool:
    res = await git.run(
        "merge-base", "--is-ancestor", older, newer, cwd=cwd, check=False, worktree=worktree
    )
    if res.returncode not in (0, 1):
        raise git.failure("git merge-base", res)
    return res.returncode == 0


async def clone(git: GitRunner, path: str, clone_url: str) -> None:
    """Clone ``clone_url`` to ``path`` (absent or an empty directory).

    Cloned next to its final place and renamed in only when complete, so a clone that
    failed or was killed at its time limit never leaves a half-clone that the next
    attempt would have to call dirty. Validated names never start with ".", so the
    staging name cannot collide with a repository."""
    parent = os.path.dirname(path)
    staging = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(path)}.clone-")
    try:
        await git.run(
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


async def fetch_pull(git: GitRunner, main: str, pull: PullRequestRefs) -> str:
    """Fetch the pull request's head (maybe from a fork) into a private ref of the main
    clone; return the commit the session should follow."""
    head_url = check_url(pull.head_clone_url, "head clone URL")
    ref = check_ref(pull.head_ref, "head ref")
    if not ref.startswith("refs/"):
        ref = f"refs/heads/{ref}"
    sha = check_sha(pull.head_sha, "head sha")
    origin = await git.run("config", "--get", "remote.origin.url", cwd=main)
    # The bot's token goes only to the host we cloned from, never to a fork URL that
    # points somewhere else.
    auth = same_origin(head_url, urlsplit(origin.stdout.strip()))
    local = f"refs/forgeflow/pull/{int(pull.number)}/head"
    await git.run(
        "fetch", "--quiet", "--no-tags", "--no-recurse-submodules",
        "--no-write-fetch-head", "--", pull.head_clone_url, f"+{ref}:{local}",
        cwd=main, auth=auth,
    )  # fmt: skip
    have = await git.run("cat-file", "-e", f"{sha}^{{commit}}", cwd=main, check=False)
    if have.returncode == 0:
        return sha
    # The payload's head is gone (force-pushed since): the fetched tip is the head now.
    return await commit_of(git, main, local)


async def remote_head(git: GitRunner, main: str, clone_url: str, branch: str) -> str | None:
    """Gitea's head of ``branch`` now (None: no such branch)."""
    ref = f"refs/heads/{check_ref(branch, 'branch')}"
    out = await git.run(
        "ls-remote", "--", check_url(clone_url, "clone URL").geturl(), ref,
        cwd=main, auth=True,
    )  # fmt: skip
    first = out.stdout.split()
    return check_sha(first[0], "remote head") if first else None


async def push(git: GitRunner, main: str, clone_url: str, sha: str, branch: str) -> str | None:
    """Push ``sha`` to ``branch`` on Gitea, fast-forward only (no force, ever); from the
    main clone to the clone URL we know, not to what its config says. None when it
    landed, else git's reason, scrubbed."""
    spec = f"{check_sha(sha, 'commit')}:refs/heads/{check_ref(branch, 'branch')}"
    res = await git.run(
        "push", "--porcelain", "--no-verify", "--",
        check_url(clone_url, "clone URL").geturl(), spec,
        cwd=main, auth=True, check=False,
    )  # fmt: skip
    if res.returncode == 0:
        return None
    lines = [ln for ln in (res.stdout + "\n" + res.stderr).splitlines() if ln.strip()]
    reasons = [ln for ln in lines if ln.startswith(("!", "remote:", "error:", "fatal:"))]
    return "; ".join(reasons or lines[-3:])[:1000] or f"git push exited {res.returncode}"
