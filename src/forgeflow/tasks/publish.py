"""Publishing a session's work: the push of its branch after a turn in which the agent
committed (or earlier, when the agent asks through its ``push_branch`` tool).

Every push is an intent row before ``git push`` and a result after (``store/pushes``);
a retry first asks Gitea for the branch and finishes the record when the commit is
already there, so a crash between the push and its record neither loses nor repeats
it. A refused push (someone pushed meanwhile, a protected branch, a server hook) fails
no task: it is audited, and the next turn's prompt says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog
from sqlalchemy import Connection

from forgeflow.domain import publish as rules
from forgeflow.domain.records import Repository, Task
from forgeflow.redaction import redact_text
from forgeflow.store import Store, pushes, repos, tasks
from forgeflow.store import audit as audit_q
from forgeflow.tasks.moves import task_event
from forgeflow.workspace.git import WorkspaceError
from forgeflow.workspace.manager import WorkspaceManager

log = structlog.get_logger("forgeflow.tasks.publish")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What publishing did: ``pushed``, ``refused``, ``up_to_date``, ``nothing`` (no new
    commit), or ``local`` (the session's work is not published)."""

    result: str
    branch: str | None = None
    sha: str | None = None
    detail: str = ""

    def note(self) -> str | None:
        """The line forgeflow adds to the turn's answer: where the work went, or why
        it did not; None when there is nothing to say."""
        if self.result == "pushed":
            return f"forgeflow: pushed the work to `{self.branch}` ({(self.sha or '')[:10]})."
        if self.result == "refused":
            return (
                f"forgeflow: the push of `{self.branch}` was refused ({self.detail[:300]}); "
                "the work stays in the session's worktree and the next turn is told."
            )
        if self.result == "local" and self.detail:
            return f"forgeflow: the work is not published ({self.detail})."
        return None

    def describe(self) -> str:
        if self.result == "pushed":
            return f"pushed: the branch {self.branch} on Gitea is now at {self.sha}"
        if self.result == "up_to_date":
            return f"nothing to push: the branch {self.branch} on Gitea is already at {self.sha}"
        if self.result == "nothing":
            return "nothing to push: there is no new commit on your branch"
        if self.result == "local":
            return f"not published: {self.detail}"
        return f"the push of {self.branch} was refused: {self.detail}"


class Publisher:
    def __init__(self, store: Store, workspace: WorkspaceManager) -> None:
        self.store = store
        self.workspace = workspace

    async def for_session(self, session_key: str) -> tuple[bool, str]:
        """The agent's ``push_branch`` tool: publish now; (ok, what happened)."""
        task = await self.store.read(lambda c: tasks.running_in_session(c, session_key))
        if task is None:
            return False, "no turn of this session is running"
        outcome = await self.publish(task)
        return outcome.result != "refused", outcome.describe()

    async def publish(self, task: Task) -> Outcome:
        resource = task.resource
        repo_row = await self.store.read(lambda c: repos.get(c, task.repo_key))
        assert repo_row is not None
        default, url = repo_row.default_branch, repo_row.clone_url
        target = rules.target(resource, task.refs, default)
        if target.remote is None:
            return Outcome("local", detail=target.why)
        repo = resource.repo
        try:
            await self._finish_pending(task, repo_row)
            new = await self.workspace.local_head(repo, target.local)
            if new is None or await self.workspace.contains(repo, new, default):
                return Outcome("nothing", target.remote)
            old = await self.workspace.remote_head(repo, url, target.remote)
        except WorkspaceError as exc:
            return await self._refused(task, target.remote, None, str(exc))
        if old == new:
            return Outcome("up_to_date", target.remote, new)
        intent = await self.store.write(
            lambda c: pushes.intend(
                c,
                task_id=task.task_id,
                session_key=task.session_key,
                target=target.remote or "",
                old_sha=old,
                new_sha=new,
            )
        )
        return await self._push(task, intent, repo_row)

    async def _finish_pending(self, task: Task, repo_row: Repository) -> None:
        """A push left pending by a crash: done if Gitea has the commit, else again."""
        for intent in await self.store.read(lambda c: pushes.pending(c, task.task_id)):
            await self._push(task, intent, repo_row)

    async def _push(self, task: Task, intent: pushes.Push, repo_row: Repository) -> Outcome:
        repo = task.resource.repo
        url = repo_row.clone_url
        if intent.status == pushes.PUSHED:
            return Outcome("pushed", intent.target, intent.new_sha)
        try:
            if await self.workspace.remote_head(repo, url, intent.target) == intent.new_sha:
                error = None  # it landed before a crash took its record
                recovered = True
            else:
                local = rules.target(task.resource, task.refs, repo_row.default_branch).local
                error = await self.workspace.push(
                    repo, url, intent.new_sha, intent.target, local=local
                )
                recovered = False
        except WorkspaceError as exc:
            error, recovered = str(exc), False
        if error is not None:
            return await self._refused(task, intent.target, intent, error)
        event = task_event(
            task,
            "publish.pushed",
            metadata={
                "branch": intent.target,
                "from": intent.old_sha,
                "to": intent.new_sha,
                "recovered": recovered,
            },
        )

        def done(c: Connection) -> None:
            pushes.finish(c, intent.push_key, pushes.PUSHED)
            audit_q.append(c, event)

        await self.store.write(done)
        return Outcome("pushed", intent.target, intent.new_sha)

    async def _refused(
        self, task: Task, branch: str, intent: pushes.Push | None, error: str
    ) -> Outcome:
        # git's remote output is the server's (or whoever answered) words: it goes to
        # the log, scrubbed; the audit, the answer and the next prompt get a code and
        # forgeflow's own reason.
        code, reason = refusal(error)
        log.warning("publish.refused", task_id=task.task_id, branch=branch, code=code,
                    output=redact_text(" ".join(error.split()))[:2000])  # fmt: skip
        detail = f"{code}: {reason}"
        event = task_event(
            task, "publish.refused", metadata={"branch": branch, "code": code, "error": detail}
        )

        def done(c: Connection) -> None:
            if intent is not None:
                pushes.finish(c, intent.push_key, pushes.REFUSED, detail)
            audit_q.append(c, event)

        await self.store.write(done)
        return Outcome("refused", branch, detail=detail)


# (what git or Gitea printed, lower-cased) -> the code and forgeflow's reason
_REFUSALS = (
    (("non-fast-forward", "fetch first", "stale info", "is behind its remote"),
     "push_not_fast_forward",
     "the branch on Gitea has commits the session does not have"),
    (("default branch",), "push_default_branch", "forgeflow never pushes to the default branch"),
    (("protected",), "push_protected_branch", "the branch is protected on Gitea"),
    (("hook declined", "pre-receive", "update hook"), "push_hook_declined",
     "a server hook on Gitea declined the push"),
    (("authentication", "401", "403", "could not read username", "access denied"),
     "git_auth_failed", "Gitea did not accept forgeflow's credentials"),
    (("bundle", "jail", "out of the jail"), "publish_bundle_refused",
     "the session's commits could not be taken out of its jail intact"),
)  # fmt: skip


def refusal(error: str) -> tuple[str, str]:
    """The code and the reason forgeflow states for a failed push."""
    lowered = error.lower()
    for needles, code, reason in _REFUSALS:
        if any(n in lowered for n in needles):
            return code, reason
    return "push_failed", "git could not push the branch to Gitea (see forgeflow's log)"
