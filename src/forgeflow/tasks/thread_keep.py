"""A session's Codex thread beyond its worker (issue #27).

After each turn the thread's rollout is read out of the jail (the runtime's
``export_thread``) and kept in the database; a worker whose app-server does not know the
thread restores it from there (agent/threads.py). A thread that cannot be restored
(nothing kept, too big, corrupt) is rebuilt: a new thread whose first prompt carries the
conversation (the earlier answers, on a pull request those in its review threads too,
and the session branch's commits; the issue's comments are in every prompt already), and
the task's audit says ``session.thread_rebuilt``.
"""

from __future__ import annotations

import contextlib

from sqlalchemy import Connection

from forgeflow.agent.port import AgentRuntime, ThreadArchive
from forgeflow.domain.ids import ResourceKind, ResourceRef
from forgeflow.domain.markers import MarkerKind, parse_marker
from forgeflow.domain.prompt import Rebuilt
from forgeflow.domain.records import Task
from forgeflow.domain.rollout import NotKept, Rollout
from forgeflow.domain.transcript import clip
from forgeflow.gitea.client import GiteaClient, GiteaError
from forgeflow.store import Store, repos
from forgeflow.store import session_threads as kept_q
from forgeflow.tasks.moves import TaskMoves
from forgeflow.tasks.threads import ReviewThreads
from forgeflow.workspace.git import GitFailed, GitTimeout, WorkspaceDirty
from forgeflow.workspace.injail import JailGit

ANSWERS = 5  # the earlier answers a rebuilt thread's first prompt carries
ANSWER_LIMIT = 3_000
COMMITS = 30
COMMITS_LIMIT = 64 * 1024

# $1 the worktree, $2 the default branch: the session branch's commits since it.
COMMITS_STEP = f"""
export LC_ALL=C GIT_TERMINAL_PROMPT=0 GIT_OPTIONAL_LOCKS=0
cd "$1" || exit 0
git -c core.hooksPath=/dev/null -c core.fsmonitor=false log --no-color -n {COMMITS} \\
  --format='%h %s' "refs/remotes/origin/$2..HEAD" -- 2>/dev/null
"""


def _is_answer(body: str) -> bool:
    """A comment of the bot's that is a task's answer: its marker (on the last line,
    forgeflow's) says final or fallback. Not the words ``kind=final`` anywhere: the
    bot's comments also carry other people's and the agent's text (a review's line
    comments, whose quoted markers keep them), which is no answer of the session."""
    marker = parse_marker(body)
    return marker is not None and marker.kind in (MarkerKind.FINAL, MarkerKind.FALLBACK)


class ThreadKeeper:
    def __init__(
        self,
        store: Store,
        runtime: AgentRuntime,
        git: JailGit,
        moves: TaskMoves,
        gitea: GiteaClient,
        bot_login: str,
        review_threads: ReviewThreads | None = None,
    ) -> None:
        """``review_threads``: where a pull request's answers in review threads are."""
        self.review_threads = review_threads
        self.store = store
        self.archive = runtime if isinstance(runtime, ThreadArchive) else None
        self.git = git
        self.moves = moves
        self.gitea = gitea
        self.bot_login = bot_login.lower()

    async def kept(self, session_key: str, thread_id: str) -> Rollout | NotKept:
        return await self.store.read(lambda c: kept_q.rollout(c, session_key, thread_id))

    async def keep(self, task: Task, resource: ResourceRef, thread_id: str, turn_key: str) -> None:
        """Keep the thread as this turn left it; a failure only costs a later restore."""
        if self.archive is None:
            return
        repo = resource.repo
        got = await self.archive.export_thread(repo.owner, repo.name, thread_id)
        await self.store.write(lambda c: kept_q.keep(c, task.session_key, thread_id, turn_key, got))
        if isinstance(got, NotKept):
            await self.moves.audit(
                task,
                "session.thread_not_kept",
                metadata={"threadId": thread_id, "reason": got.reason, "detail": got.detail},
            )

    async def rebuilt(
        self, task: Task, resource: ResourceRef, cwd: str, previous: str, thread_id: str
    ) -> Rebuilt:
        """What a rebuilt thread's first prompt carries; audited as the rebuild."""

        def read(c: Connection) -> str:
            repo_row = repos.get(c, task.repo_key)
            return repo_row.default_branch if repo_row else "main"

        default = await self.store.read(read)
        answers = await self._answers(resource)
        commits = await self._commits(resource, cwd, default)
        await self.moves.audit(
            task,
            "session.thread_rebuilt",
            metadata={
                "threadId": thread_id,
                "previousThreadId": previous,
                "answers": len(answers),
                "commits": len(commits),
            },
        )
        return Rebuilt(answers=answers, commits=commits)

    async def _answers(self, resource: ResourceRef) -> list[str]:
        """The bot's earlier final answers on the issue, oldest first, from Gitea (the
        prompt's discussion leaves the bot's own comments out); on a pull request also
        those in its review threads, each saying where it was."""
        repo = resource.repo
        try:
            comments = await self.gitea.list_comments(repo.owner, repo.name, resource.number)
        except GiteaError:
            return []
        said = [(c.id, c.body) for c in comments if (c.user.login or "").lower() == self.bot_login]
        if self.review_threads is not None and resource.kind is ResourceKind.PULL_REQUEST:
            with contextlib.suppress(GiteaError):  # the timeline's answers still count
                said += await self.review_threads.answers(repo, resource.number, _is_answer)
        answers = []
        for _id, body in sorted(said):
            if not _is_answer(body):
                continue
            text = "\n".join(x for x in body.splitlines() if not x.startswith("<!-- ccweb"))
            answers.append(clip(text.strip(), ANSWER_LIMIT)[0])
        return answers[-ANSWERS:]

    async def _commits(self, resource: ResourceRef, cwd: str, default: str) -> list[str]:
        """The session branch's commits since the default branch, newest first (their
        subjects are the agent's text: bounded here and fenced in the prompt)."""
        try:
            res = await self.git.step(
                COMMITS_STEP, resource.repo, cwd, cwd, default,
                limit=COMMITS_LIMIT, read_only=True,
            )  # fmt: skip
        except (WorkspaceDirty, GitFailed, GitTimeout):
            return []
        if res.returncode != 0 or res.timed_out:
            return []
        text = res.stdout.decode("utf-8", "replace")
        return [line[:200] for line in text.splitlines() if line.strip()][:COMMITS]
