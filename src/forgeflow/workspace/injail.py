"""git on the agent's clone and worktrees, run inside the repository's jail.

Each preparation step is one shell script in one one-shot jail (agent/oneshot.py): a
bwrap start costs milliseconds, a git process less. The scripts print ``ff:<word>
[value]`` lines and, last, ``ff:status`` followed by ``git status --porcelain=v2 -z``.
All of it is the agent's to forge: parsed with bounds, shas checked, and never a path
that forgeflow then acts on. A lie only misleads forgeflow about the agent's own
repository; the host's actions (which mirror, which URL, which ref is pushed) are
chosen by the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from forgeflow.agent.jail import JailRefused
from forgeflow.agent.oneshot import JailResult, JailRunner
from forgeflow.domain.ids import RepoRef
from forgeflow.workspace.git import GitFailed, GitTimeout, WorkspaceDirty, check_sha
from forgeflow.workspace.status import WorktreeStatus, parse_status

# What a step's refusal word means, for the WorkspaceDirty it becomes.
DIRTY = {
    "not_a_clone": "exists but is not a forgeflow clone",
    "index_lock": "has a stale index.lock",
    "occupied": "is taken by something that is not this session's worktree",
    "need_bundle": "was emptied since forgeflow last filled it",
}

OUTPUT_LIMIT = 4 * 1024 * 1024  # a status of a huge tree is cut, not trusted to end
BUNDLE_LIMIT = 512 * 1024 * 1024  # what a session's publish bundle may weigh

# git without the agent's hooks, fsmonitor or auto-gc: they would run inside the jail
# anyway, but a preparation must not wait on them.
_G = (
    "g() { git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c gc.auto=0 "
    '-c maintenance.auto=false -c advice.detachedHead=false "$@"; }\n'
    "export LC_ALL=C GIT_TERMINAL_PROMPT=0 GIT_OPTIONAL_LOCKS=0\n"
)
_STATUS = "g status --porcelain=v2 --branch -z --untracked-files=all --ignored=no"

# $1 the clone, $2 "bundle" when one comes on stdin, $3 the origin URL to record.
# A clone is made below a marker folder, made first and removed last: a kill on the way
# (a worker's death) leaves the marker, and the next step makes the clone again instead
# of finding a broken one that blocks the repository. No turn has seen it by then.
REPO_STEP = (
    _G
    + f"""
m="$1/.forgeflow-cloning"
if [ -z "$(ls -A "$1")" ] || [ -d "$m" ]; then
  [ "$2" = bundle ] || {{ echo ff:need_bundle; exit 0; }}
  find "$1" -mindepth 1 -delete && mkdir "$m" || exit 1
  cat > /tmp/in.bundle || exit 1
  if ! {{ g clone -q --no-checkout --origin origin /tmp/in.bundle "$m/c" >&2 \\
      && mv "$m/c/.git" "$1/.git" && g -C "$1" reset -q --hard HEAD >&2; }}; then
    find "$1" -mindepth 1 -delete; echo ff:clone_failed; exit 0
  fi
  g -C "$1" remote set-url origin "$3"; rm -rf "$m"; echo ff:cloned; exit 0
fi
cd "$1" || exit 1
top=$(g rev-parse --show-toplevel 2>/dev/null) && [ "$top" = "$1" ] \\
  || {{ echo ff:not_a_clone; exit 0; }}
gd=$(g rev-parse --absolute-git-dir)
dirty=
[ -e "$gd/index.lock" ] && {{ echo ff:index_lock; dirty=1; }}
[ -n "$(g status --porcelain=v1 --untracked-files=all --ignored=no)" ] && dirty=1
if [ "$2" = bundle ] && [ -z "$dirty" ]; then
  cat > /tmp/in.bundle && g fetch -q --no-tags --no-write-fetch-head /tmp/in.bundle \\
    '+refs/heads/*:refs/remotes/origin/*' >&2 && echo ff:fetched || echo ff:fetch_failed
fi
echo ff:status; {_STATUS}
"""
)

# $1 clone, $2 worktree, $3 branch, $4 start commit, $5 pull number or "", $6 "bundle",
# $7 "check": the clone's check first (a follow-up with nothing to deliver runs one jail,
# not two); anything unusual there says ff:clone_* and the repo step gives the verdict.
# $8 "published": $4 is the session branch's head on Gitea (published.py): the worktree
# starts there, and the local branch is compared with it (ff:diverged / ff:behind).
SESSION_STEP = (
    _G
    + f"""
cd "$1" || {{ echo ff:clone_gone; exit 0; }}
if [ "$7" = check ]; then
  top=$(g rev-parse --show-toplevel 2>/dev/null) && [ "$top" = "$1" ] \\
    || {{ echo ff:clone_not_a_clone; exit 0; }}
  [ -e "$(g rev-parse --absolute-git-dir)/index.lock" ] && {{ echo ff:clone_index_lock; exit 0; }}
  [ -n "$(g status --porcelain=v1 --untracked-files=all --ignored=no)" ] \\
    && {{ echo ff:clone_dirty; exit 0; }}
fi
target=
if [ -n "$5" ]; then
  local=refs/forgeflow/pull/$5/head
  if [ "$6" = bundle ]; then
    cat > /tmp/pull.bundle && g fetch -q --no-tags --no-write-fetch-head /tmp/pull.bundle \\
      "+$local:$local" >&2 || {{ echo ff:fetch_failed; exit 0; }}
  fi
  target=$(g rev-parse --verify --quiet "$4^{{commit}}") || {{ echo ff:no_target; exit 0; }}
elif [ "$8" = published ]; then
  if [ "$6" = bundle ]; then
    cat > /tmp/session.bundle && g fetch -q --no-tags --no-write-fetch-head /tmp/session.bundle \\
      "+refs/heads/$3:refs/remotes/origin/$3" >&2 || {{ echo ff:fetch_failed; exit 0; }}
  fi
  target=$(g rev-parse --verify --quiet "$4^{{commit}}") || {{ echo ff:no_target; exit 0; }}
fi
if [ ! -e "$2" ] && [ ! -L "$2" ]; then
  # A stale registration (its folder deleted) is pruned; a branch that outlived its
  # worktree is checked out as it is: its commits are the session's work.
  g worktree add -q --no-track -b "$3" -- "$2" "$4" >&2 || {{
    g worktree prune
    g worktree add -q --no-track -b "$3" -- "$2" "$4" >&2 || g worktree add -q -- "$2" "$3" >&2 \\
      || {{ echo ff:add_failed; exit 0; }}
  }}
  echo ff:created
fi
cd "$2" 2>/dev/null || {{ echo ff:occupied; exit 0; }}
# One git for the three: each git process is a measurable part of a warm task's start.
dirs=$(g rev-parse --show-toplevel --git-common-dir --absolute-git-dir 2>/dev/null) \\
  || {{ echo ff:occupied; exit 0; }}
{{ read -r top; read -r common; read -r admin; }} <<EOF
$dirs
EOF
[ "$top" = "$2" ] || {{ echo ff:occupied; exit 0; }}
common=$(cd "$common" 2>/dev/null && pwd -P)
[ "$common" = "$(cd "$1/.git" && pwd -P)" ] || {{ echo ff:occupied; exit 0; }}
# Registered at this very path (a copy of another worktree points elsewhere).
[ "$(cat "$admin/gitdir" 2>/dev/null)" = "$2/.git" ] || {{ echo ff:occupied; exit 0; }}
[ -e "$admin/index.lock" ] && {{ echo ff:index_lock; exit 0; }}
if [ -n "$target" ] && [ -z "$5" ]; then
  # The session's published head: never reset; behind and clean on the branch is
  # fast-forwarded, anything else is named (both heads) and blocks.
  b=$(g rev-parse --verify --quiet "refs/heads/$3")
  if [ "$b" = "$target" ]; then :
  elif [ -n "$b" ] && g merge-base --is-ancestor "$target" "$b" 2>/dev/null; then :
  elif [ -n "$b" ] && g merge-base --is-ancestor "$b" "$target" 2>/dev/null; then
    if [ "$(g symbolic-ref -q HEAD)" = "refs/heads/$3" ] \\
      && [ -z "$(g status --porcelain=v1 --untracked-files=all --ignored=no)" ]; then
      g merge -q --ff-only --no-edit "$target" >&2 && echo ff:forwarded || echo "ff:behind $b"
    else echo "ff:behind $b"; fi
  else echo "ff:diverged $b"; fi
elif [ -n "$target" ]; then
  head=$(g rev-parse --verify --quiet HEAD)
  if [ "$head" = "$target" ]; then :
  elif g merge-base --is-ancestor "$target" HEAD 2>/dev/null; then :
  elif [ -n "$head" ] && g merge-base --is-ancestor HEAD "$target"; then
    if [ -z "$(g status --porcelain=v1 --untracked-files=all --ignored=no)" ]; then
      g merge -q --ff-only --no-edit "$target" >&2 && echo ff:forwarded
    else echo ff:moved; fi
  else echo ff:moved; fi
fi
echo ff:status; {_STATUS}
"""
)

# $1 the worktree (or clone): its status only.
STATUS_STEP = _G + f'cd "$1" || {{ echo ff:occupied; exit 0; }}\necho ff:status; {_STATUS}\n'

# $1 clone, $2 worktree: remove it when clean; prune when it is gone.
REMOVE_STEP = (
    _G
    + """
cd "$1" || exit 1
if [ ! -e "$2" ] && [ ! -L "$2" ]; then g worktree prune; echo ff:gone; exit 0; fi
[ -n "$(g -C "$2" status --porcelain=v1 --untracked-files=all --ignored=no)" ] && {
  echo ff:dirty; echo ff:status; cd "$2" && g status --porcelain=v2 --branch -z \
  --untracked-files=all --ignored=no; exit 0; }
g worktree remove -- "$2" >&2 && echo ff:removed || echo ff:occupied
"""
)

# $1 clone, $2 ref: its commit.
HEAD_STEP = _G + 'cd "$1" && g rev-parse --verify --quiet "$2^{commit}"\n'

# $1 clone, $2 ref: a bundle of it on stdout, without what origin's branches hold.
BUNDLE_STEP = _G + 'cd "$1" && g bundle create --quiet - "$2" --not --remotes=origin\n'


@dataclass(frozen=True)
class Report:
    """What a step script said: its ``ff:`` words and the status, if it printed one."""

    words: dict[str, str] = field(default_factory=dict)
    status: WorktreeStatus | None = None


def parse(result: JailResult, what: str) -> Report:
    if result.timed_out:
        raise GitTimeout(f"{what} did not finish within its time limit")
    if result.truncated:
        raise GitFailed(f"{what} printed more than forgeflow reads")
    if result.returncode != 0:
        raise GitFailed(f"{what} failed in the jail (exit {result.returncode})",
                        details={"stderr": _tail(result.stderr)})  # fmt: skip
    out = result.stdout
    head, marker, tail = out.partition(b"ff:status\n")
    words: dict[str, str] = {}
    for line in head.decode("utf-8", "replace").splitlines()[:50]:
        if line.startswith("ff:"):
            word, _, value = line[3:].partition(" ")
            words[word[:40]] = value[:200]
    status = parse_status(tail.decode("utf-8", "replace")) if marker else None
    return Report(words, status)


def _tail(data: bytes) -> str:
    return data[-2000:].decode("utf-8", "replace")


class JailGit:
    """The steps above, each one jail run."""

    def __init__(self, runner: JailRunner, timeout: float) -> None:
        self.runner = runner
        self.timeout = timeout

    async def step(
        self, script: str, repo: RepoRef, cwd: str, *args: str, stdin: Path | None = None,
        limit: int = OUTPUT_LIMIT, read_only: bool = False,
    ) -> JailResult:  # fmt: skip
        try:
            return await self._run(script, repo, cwd, args, stdin, limit, read_only)
        except JailRefused as exc:
            raise WorkspaceDirty(str(exc), details={"path": cwd, "reason": exc.reason}) from None

    async def _run(
        self, script: str, repo: RepoRef, cwd: str, args: tuple[str, ...],
        stdin: Path | None, limit: int, read_only: bool,
    ) -> JailResult:  # fmt: skip
        return await self.runner.run(
            ["/bin/sh", "-c", script, "forgeflow-git", *args],
            repository=repo,
            cwd=cwd,
            stdin=stdin,
            timeout=self.timeout,
            output_limit=limit,
            read_only=read_only,
            network=False,  # git here reads bundles; it needs no network
        )

    async def head(self, repo: RepoRef, clone: str, ref: str) -> str | None:
        res = await self.step(HEAD_STEP, repo, clone, clone, ref, read_only=True)
        if res.returncode != 0 or res.truncated or res.timed_out:
            return None
        return check_sha(res.stdout.decode("ascii", "replace").strip(), "session head")
