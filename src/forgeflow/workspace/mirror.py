"""forgeflow's own bare mirror of a repository: the only repository its credentialed
git works in.

It lives at ``<root>/.mirrors/default/<owner>/<repo>.git``, outside every jail's binds,
made and configured by forgeflow alone (``git init --bare``; nothing is ever written to
its config). Fetches and pushes name the URL on the command line, so no remote, proxy
or ``insteadOf`` of anyone else's applies. Objects reach the agent's clone as bundles
made here, and come back from the jail as a bundle that is verified and fetched here
into a private ref before a push of exactly that commit.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from forgeflow.domain.ids import INSTANCE_ID, RepoRef
from forgeflow.workspace.git import (
    GitFailed,
    GitResult,
    GitRunner,
    check_ref,
    check_sha,
    check_url,
    same_origin,
)

MIRRORS_DIR = ".mirrors"
# git options for a bundle file forgeflow wrote from the jail's output: every object is
# checked, and the file transport (refused for all else) reads this one host file.
_FROM_JAIL = ("-c", "transfer.fsckObjects=true", "-c", "protocol.file.allow=always")


def mirror_path(root: Path, repo: RepoRef) -> str:
    return str(root / MIRRORS_DIR / INSTANCE_ID / repo.owner / f"{repo.name}.git")


async def ensure(git: GitRunner, path: str, clone_url: str, branch: str) -> bool:
    """Make the mirror (fetched fresh from Gitea, never from an agent's clone) when it
    is not there; True when it was made now."""
    if os.path.isdir(os.path.join(path, "objects")):
        return False
    parent = os.path.dirname(path)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    staging = tempfile.mkdtemp(dir=parent, prefix=".staging-")
    try:
        await git.run("init", "--quiet", "--bare", staging)
        await fetch(git, staging, clone_url, branch)
        os.rename(staging, path)
    finally:
        if os.path.isdir(staging):
            shutil.rmtree(staging, ignore_errors=True)
    return True


async def fetch(git: GitRunner, path: str, clone_url: str, branch: str) -> None:
    """Gitea's branches into the mirror's branches, and HEAD at the default branch (a
    bundle's HEAD tells a first clone what to check out)."""
    url = check_url(clone_url, "clone URL").geturl()
    await git.run(
        "fetch", "--quiet", "--prune", "--no-tags", "--no-recurse-submodules",
        "--no-write-fetch-head", "--", url, "+refs/heads/*:refs/heads/*",
        cwd=path, auth=True,
    )  # fmt: skip
    ref = f"refs/heads/{check_ref(branch, 'default branch')}"
    await git.run("symbolic-ref", "HEAD", ref, cwd=path)


async def commit_of(git: GitRunner, path: str, ref: str) -> str | None:
    res = await git.run(
        "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", cwd=path, check=False
    )
    return res.stdout.strip() if res.returncode == 0 else None


async def has_commit(git: GitRunner, path: str, sha: str) -> bool:
    res = await git.run("cat-file", "-e", f"{check_sha(sha, 'commit')}^{{commit}}", cwd=path,
                        check=False)  # fmt: skip
    return res.returncode == 0


async def tips(git: GitRunner, path: str) -> set[str]:
    """The commits of the mirror's branches (what a bundle of it would deliver)."""
    out = await git.run("for-each-ref", "--format=%(objectname)", "refs/heads/", cwd=path)
    return {check_sha(line, "branch tip") for line in out.stdout.split()}


async def bundle(git: GitRunner, path: str, out: str, refs: list[str], known: set[str]) -> bool:
    """Write a bundle of ``refs`` to ``out``, without what the receiver has (``known``,
    commits of this mirror); False when there is nothing new to send."""
    nots = [f"^{check_sha(sha, 'known commit')}" for sha in sorted(known)]
    res = await git.run("bundle", "create", "--quiet", out, *refs, *nots, cwd=path, check=False)
    if res.returncode == 0:
        return True
    if "empty bundle" in res.stderr:
        return False
    raise git.failure("git bundle create", res)


async def fetch_pull(
    git: GitRunner, path: str, clone_url: str, head_url: str, head_ref: str, number: int
) -> str:
    """The pull request's head (maybe from a fork) into ``refs/forgeflow/pull/<n>/head``
    of the mirror; the token goes only to the host we clone from."""
    ref = check_ref(head_ref, "head ref")
    if not ref.startswith("refs/"):
        ref = f"refs/heads/{ref}"
    auth = same_origin(check_url(head_url, "head clone URL"), check_url(clone_url, "clone URL"))
    local = f"refs/forgeflow/pull/{int(number)}/head"
    await git.run(
        "fetch", "--quiet", "--no-tags", "--no-recurse-submodules",
        "--no-write-fetch-head", "--", head_url, f"+{ref}:{local}",
        cwd=path, auth=auth,
    )  # fmt: skip
    sha = await commit_of(git, path, local)
    if sha is None:
        raise GitFailed(f"{local} does not name a commit", details={"ref": local})
    return sha


async def take_bundle(git: GitRunner, path: str, bundle_file: str, ref: str, sha: str,
                      private: str) -> None:  # fmt: skip
    """Verify a bundle the jail wrote, fetch its ``ref`` into the mirror's ``private``
    ref and check that it is the commit the jail named; GitFailed otherwise."""
    await git.run("bundle", "verify", "--quiet", bundle_file, cwd=path)
    heads = await git.run("bundle", "list-heads", bundle_file, ref, cwd=path)
    named = heads.stdout.split()
    if len(named) != 2 or named[0] != sha or named[1] != ref:
        raise GitFailed("the session's bundle does not hold the commit it was made for")
    await git.run(
        *_FROM_JAIL, "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--",
        bundle_file, f"+{ref}:{private}", cwd=path,
    )  # fmt: skip
    if await commit_of(git, path, private) != sha:
        raise GitFailed("the fetched commit is not the session's head")


async def push(git: GitRunner, path: str, clone_url: str, sha: str, branch: str) -> str | None:
    """Push ``sha`` from the mirror to ``branch`` on Gitea, fast-forward only (no force,
    ever); None when it landed, else git's output (for the log only)."""
    spec = f"{check_sha(sha, 'commit')}:refs/heads/{check_ref(branch, 'branch')}"
    res = await git.run(
        "push", "--porcelain", "--no-verify", "--",
        check_url(clone_url, "clone URL").geturl(), spec,
        cwd=path, auth=True, check=False,
    )  # fmt: skip
    if res.returncode == 0:
        return None
    lines = [ln for ln in (res.stdout + "\n" + res.stderr).splitlines() if ln.strip()]
    return "; ".join(lines)[:4000] or f"git push exited {res.returncode}"


async def diff_since(git: GitRunner, path: str, old: str, new: str, *, limit: int) -> str | None:
    """What ``new`` changes since ``old`` (``git diff old new``, its first ``limit``
    bytes) when ``old`` is an ancestor of ``new``; None when it is not (a force-push
    rewrote the branch, or the mirror never had ``old``: once a pull request's head is
    fetched, every ancestor of it is here). Read in forgeflow's mirror, which no jail
    binds, with no external diff driver or text conversion the repository could name."""
    old, new = check_sha(old, "earlier head"), check_sha(new, "head")
    if not await has_commit(git, path, new):
        raise GitFailed(f"the head {new} is not in the mirror", details={"sha": new})
    if not await has_commit(git, path, old):
        return None
    res = await git.run("merge-base", "--is-ancestor", old, new, cwd=path, check=False)
    if res.returncode not in (0, 1):
        raise git.failure("git merge-base", res)
    if res.returncode == 1:
        return None
    args = ("diff", "--no-color", "--no-ext-diff", "--no-textconv", old, new, "--")
    return (await git.run(*args, cwd=path, time_limit=30, max_output=limit)).stdout


async def branch_diff(git: GitRunner, path: str, base: str, sha: str, *, limit: int) -> GitResult:
    """What a published ``sha`` changes since it left ``base`` (``git diff base...sha``,
    its first ``limit`` bytes: the agent's commits are as long as it likes), read in the
    mirror: no external diff driver or text conversion."""
    base = check_ref(base, "base")
    if base.startswith("refs/remotes/origin/"):
        base = "refs/heads/" + base.removeprefix("refs/remotes/origin/")
    spec = f"{base}...{check_sha(sha, 'commit')}"
    args = ("diff", "--no-color", "--no-ext-diff", "--no-textconv", spec, "--")
    return await git.run(*args, cwd=path, time_limit=30, max_output=limit)


# What a repository file forgeflow reads from the mirror may weigh (a setup script).
FILE_LIMIT = 1024 * 1024


async def file_at(git: GitRunner, path: str, commit: str, name: str) -> tuple[bool, str] | None:
    """A regular file of ``commit`` in the mirror (what Gitea has, never the agent's
    clone): whether it is executable, and its text. None when ``name`` is not a regular
    file there (missing, a link, a folder, a submodule) or is over FILE_LIMIT."""
    res = await git.run(
        "ls-tree", "-z", "--full-tree", check_sha(commit, "commit"), "--", name,
        cwd=path, check=False,
    )  # fmt: skip
    meta, _, found = res.stdout.split("\0", 1)[0].partition("\t")
    words = meta.split()
    if res.returncode != 0 or found != name or len(words) != 3 or words[1] != "blob":
        return None
    if words[0] not in ("100644", "100755"):
        return None
    blob = check_sha(words[2], "blob")
    size = await git.run("cat-file", "-s", blob, cwd=path)
    if int(size.stdout.strip()) > FILE_LIMIT:
        return None
    text = await git.run("cat-file", "blob", blob, cwd=path)
    return words[0] == "100755", text.stdout


async def archive(git: GitRunner, path: str, commit: str, out: Path) -> None:
    """A tar of ``commit``'s tree (what Gitea has, never the agent's clone) written to
    ``out``, a file of forgeflow's; it is unpacked only inside a jail."""
    await git.run(
        "archive", "--format=tar", f"--output={out}", check_sha(commit, "commit"),
        cwd=path,
    )  # fmt: skip
