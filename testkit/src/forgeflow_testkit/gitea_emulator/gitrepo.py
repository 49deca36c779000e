"""Bare git repositories changed with plumbing commands (no work tree needed)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

ZERO_SHA = "0" * 40


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """An environment that ignores the caller's global and system git configuration."""
    env = dict(os.environ)
    env.update({"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C"})
    env.pop("GIT_DIR", None)
    env.pop("GIT_INDEX_FILE", None)
    if extra:
        env.update(extra)
    return env


class GitError(RuntimeError):
    pass


@dataclass(frozen=True)
class Signature:
    name: str
    email: str


@dataclass(frozen=True)
class CommitInfo:
    sha: str
    message: str
    author: Signature
    committer: Signature
    timestamp: str
    added: list[str]
    removed: list[str]
    modified: list[str]


_COMMITS: dict[tuple[str, str], CommitInfo] = {}


class GitRepo:
    """One bare repository on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def run(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess[bytes]:
        proc = subprocess.run(
            ["git", "--git-dir", str(self.path), *args],
            input=stdin,
            capture_output=True,
            env=git_env(env),
            check=False,
        )
        if check and proc.returncode != 0:
            raise GitError(f"git {' '.join(args)}: {proc.stderr.decode(errors='replace')}")
        return proc

    def stream(self, *args: str, chunk: int = 64 * 1024) -> Iterator[bytes]:
        """``git args``'s output in chunks, never held whole here: a response streamed
        as Gitea streams a diff, so a test sees what the client holds of it."""
        proc = subprocess.Popen(
            ["git", "--git-dir", str(self.path), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=git_env(),
        )
        assert proc.stdout is not None
        try:
            while data := proc.stdout.read(chunk):
                yield data
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()

    def out(self, *args: str, env: Mapping[str, str] | None = None) -> str:
        return self.run(*args, env=env).stdout.decode().strip()

    @classmethod
    def init_bare(cls, path: Path, default_branch: str) -> GitRepo:
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["git", "init", "--bare", "--quiet", f"--initial-branch={default_branch}", str(path)],
            check=True,
            capture_output=True,
            env=git_env(),
        )
        return cls(path)

    # -- refs -----------------------------------------------------------------------

    def rev_parse(self, ref: str) -> str | None:
        proc = self.run("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
        return proc.stdout.decode().strip() or None if proc.returncode == 0 else None

    def branch_sha(self, branch: str) -> str | None:
        return self.rev_parse(f"refs/heads/{branch}")

    def refs(self) -> dict[str, str]:
        text = self.out("for-each-ref", "--format=%(refname) %(objectname)")
        return dict(line.split(" ", 1) for line in text.splitlines() if line)

    def update_ref(self, ref: str, sha: str, old: str | None = None) -> None:
        self.run("update-ref", ref, sha, *([old] if old is not None else []))

    def fetch_ref(self, source: Path, source_ref: str, target_ref: str) -> None:
        self.run("fetch", "--quiet", "--no-tags", str(source), f"+{source_ref}:{target_ref}")

    # -- commits --------------------------------------------------------------------

    def commit_files(
        self,
        branch: str,
        files: Mapping[str, str | None],
        *,
        message: str,
        author: Signature,
        when: datetime,
        parent: str | None,
    ) -> str:
        """Commit `files` (None deletes a path) on top of `parent` and move `branch` to it."""
        stamp = f"{int(when.timestamp())} +0000"
        env = {
            "GIT_AUTHOR_NAME": author.name,
            "GIT_AUTHOR_EMAIL": author.email,
            "GIT_AUTHOR_DATE": stamp,
            "GIT_COMMITTER_NAME": author.name,
            "GIT_COMMITTER_EMAIL": author.email,
            "GIT_COMMITTER_DATE": stamp,
        }
        with tempfile.TemporaryDirectory(prefix="gitea-emu-index-") as tmp:
            env["GIT_INDEX_FILE"] = str(Path(tmp) / "index")
            if parent is not None:
                self.run("read-tree", parent, env=env)
            for path, content in sorted(files.items()):
                if content is None:
                    self.run("update-index", "--force-remove", "--", path, env=env)
                    continue
                blob = self.run("hash-object", "-w", "--stdin", stdin=content.encode()).stdout
                info = f"100644,{blob.decode().strip()},{path}"
                self.run("update-index", "--add", "--cacheinfo", info, env=env)
            tree = self.out("write-tree", env=env)
        parents = ["-p", parent] if parent is not None else []
        sha = self.run("commit-tree", tree, *parents, stdin=message.encode(), env=env)
        new = sha.stdout.decode().strip()
        self.update_ref(f"refs/heads/{branch}", new, self.branch_sha(branch) or ZERO_SHA)
        return new

    def merge_base(self, a: str, b: str) -> str | None:
        proc = self.run("merge-base", a, b, check=False)
        return proc.stdout.decode().strip() or None if proc.returncode == 0 else None

    def merge_tree(self, base: str, head: str) -> str | None:
        """The merged tree of two commits, or None on conflict (git merge-tree, git >= 2.38)."""
        proc = self.run("merge-tree", "--write-tree", base, head, check=False)
        if proc.returncode != 0:
            return None
        return proc.stdout.decode().split("\n", 1)[0].strip()

    def merge_commit(
        self, base: str, head: str, *, message: str, author: Signature, when: datetime
    ) -> str | None:
        tree = self.merge_tree(base, head)
        if tree is None:
            return None
        stamp = f"{int(when.timestamp())} +0000"
        env = {
            "GIT_AUTHOR_NAME": author.name,
            "GIT_AUTHOR_EMAIL": author.email,
            "GIT_AUTHOR_DATE": stamp,
            "GIT_COMMITTER_NAME": author.name,
            "GIT_COMMITTER_EMAIL": author.email,
            "GIT_COMMITTER_DATE": stamp,
        }
        proc = self.run(
            "commit-tree", tree, "-p", base, "-p", head, stdin=message.encode(), env=env
        )
        return proc.stdout.decode().strip()

    def diff_stat(self, base: str, head: str) -> tuple[int, int, int]:
        """(additions, deletions, changed files) between two commits."""
        text = self.out("diff", "--numstat", base, head)
        additions = deletions = files = 0
        for line in text.splitlines():
            added, deleted, _ = line.split("\t", 2)
            additions += int(added) if added.isdigit() else 0
            deletions += int(deleted) if deleted.isdigit() else 0
            files += 1
        return additions, deletions, files

    def commit_info(self, sha: str) -> CommitInfo:
        # A commit never changes, so its description is kept (two git processes saved
        # on every later branch or push payload that shows it).
        key = (str(self.path), sha)
        known = _COMMITS.get(key)
        if known is None:
            if len(_COMMITS) >= 4096:
                _COMMITS.clear()
            known = _COMMITS[key] = self._read_commit(sha)
        return dataclasses.replace(
            known, added=list(known.added), removed=list(known.removed),
            modified=list(known.modified),
        )  # fmt: skip

    def _read_commit(self, sha: str) -> CommitInfo:
        fields = self.out("show", "-s", "--format=%an%x00%ae%x00%cn%x00%ce%x00%cI%x00%B", sha)
        an, ae, cn, ce, when, message = fields.split("\x00", 5)
        added: list[str] = []
        removed: list[str] = []
        modified: list[str] = []
        changes = self.out("diff-tree", "--root", "--no-commit-id", "--name-status", "-r", sha)
        for line in changes.splitlines():
            status, _, path = line.partition("\t")
            {"A": added, "D": removed}.get(status[:1], modified).append(path)
        return CommitInfo(
            sha=sha,
            message=message + "\n",
            author=Signature(an, ae),
            committer=Signature(cn, ce),
            timestamp=when,
            added=added,
            removed=removed,
            modified=modified,
        )

    def commits_between(
        self, old: str | None, new: str, exclude: list[str] | None = None
    ) -> list[CommitInfo]:
        """Commits reachable from `new` but not from `old` nor `exclude`, newest first."""
        hidden = [sha for sha in [old, *(exclude or [])] if sha and sha != ZERO_SHA]
        spec = [new, *(["--not", *hidden] if hidden else [])]
        shas = self.out("rev-list", *spec).split()
        return [self.commit_info(sha) for sha in shas]
