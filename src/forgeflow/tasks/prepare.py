"""The ``preparing`` step of a task: workspace, receipt, prompt context.

The repository's persistent clone is fetched when Gitea's branch moved, and the
session's worktree (one per issue or pull request, on its own branch) is made ready;
meanwhile the receipt is posted and the issue's discussion read from Gitea for the
prompt, so a warm task waits for the slowest of the three, not for their sum. Only so
many preparations do their workspace work at once (FORGEFLOW_MAX_PREPARATIONS); the
others wait for a place, claimed and with their leases renewed. A failure
to make the workspace ready retries the task later (or fails it when its retries are
spent); a worktree with someone else's uncommitted work blocks it for an operator.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from forgeflow.agent.port import CommentTool
from forgeflow.domain import prompt
from forgeflow.domain import publish as publish_rules
from forgeflow.domain.ids import ResourceKind, ResourceRef, parse_resource_key
from forgeflow.domain.paths import session_branch
from forgeflow.domain.records import Repository, Task
from forgeflow.domain.states import TaskState
from forgeflow.gitea.client import GiteaClient, GiteaError
from forgeflow.store import Store, audit, pushes, repos
from forgeflow.store.db import Unit
from forgeflow.tasks.dispatch import Preparing
from forgeflow.tasks.moves import TaskMoves, task_event
from forgeflow.tasks.outbox import Outbox
from forgeflow.workspace.manager import (
    PullRequestRefs,
    RepoCheckout,
    SessionWorktree,
    WorkspaceDirty,
    WorkspaceError,
    WorkspaceManager,
    WorktreeStatus,
)

S = TaskState
Discussion = tuple[str | None, list[tuple[str, str]]]


@dataclass(frozen=True, slots=True)
class Prepared:
    """What a preparation hands to the turn that follows it in the same run.

    ``status`` and ``discussion`` are None when the task did not reach ``running``;
    ``discussion`` is still being fetched from Gitea while the turn starts up, and is
    cancelled by the run if its turn does not take it."""

    task: Task
    status: WorktreeStatus | None = None
    discussion: asyncio.Task[Discussion] | None = None


class Preparer:
    def __init__(
        self,
        store: Store,
        workspace: WorkspaceManager,
        gitea: GiteaClient,
        outbox: Outbox,
        moves: TaskMoves,
        preparing: Preparing,
        *,
        bot_login: str,
    ) -> None:
        self.store = store
        self.workspace = workspace
        self.gitea = gitea
        self.outbox = outbox
        self.moves = moves
        self.preparing = preparing
        self.bot_login = bot_login

    async def prepare(self, task: Task, repo_row: Repository | None = None) -> Prepared:
        """Move a ``preparing`` task to ``running``, ``blocked_workspace``, or a retry."""
        resource = parse_resource_key(task.resource_key)
        if repo_row is None:
            repo_row = await self.store.read(lambda c: repos.get(c, task.repo_key))
        assert repo_row is not None
        discussion = asyncio.create_task(self.discussion(task, resource))
        # The receipt's record goes with the move that ends this step: a commit less.
        record: list[Unit] = []
        receipt = asyncio.create_task(self.outbox.receipt(task, record=record))
        self.preparing.expect(task.task_id)
        try:
            moved, status = await self._prepare(task, resource, repo_row, receipt, _all(record))
        except BaseException:
            discussion.cancel()
            raise
        finally:
            self.preparing.done(task.task_id)
            if not receipt.done():
                receipt.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await receipt
        if status is None:
            discussion.cancel()
            return Prepared(moved)
        return Prepared(moved, status, discussion)

    async def _prepare(
        self,
        task: Task,
        resource: ResourceRef,
        repo_row: Repository,
        receipt: asyncio.Task[list[audit.AuditEvent]],
        record: Unit,
    ) -> tuple[Task, WorktreeStatus | None]:
        """The workspace made ready, then the move that ends the step; the move waits
        for the receipt, so it is on Gitea (or its failure noted) before the turn."""
        # Rows of steps without an effect of their own, written with the next move.
        notes: list[audit.AuditEvent] = []
        try:
            # Within the bound on concurrent preparations (dispatch.Preparing); the
            # receipt and the discussion, only requests to Gitea, do not wait for it.
            async with self.preparing.place():
                worktree, refs = await self._workspace(task, resource, repo_row, notes)
        except WorkspaceDirty as exc:
            blocked = await self.moves.move(
                task,
                S.BLOCKED_WORKSPACE,
                action="task.block",
                error_code=exc.code,
                metadata={"detail": str(exc), **exc.details},
                events=notes + await receipt,
                before=record,
            )
            return blocked, None
        except (WorkspaceError, GiteaError) as exc:  # GitAuthFailed is a WorkspaceError
            code = exc.code if isinstance(exc, WorkspaceError) else "gitea_unavailable"
            retried = await self.moves.retry_or_fail(
                task, code, str(exc), events=notes + await receipt, before=record
            )
            return retried, None
        notes.append(
            task_event(
                task,
                "workspace.status",
                metadata={
                    "path": worktree.path,
                    "branch": worktree.branch,
                    "upstreamMoved": worktree.upstream_moved,
                    "status": worktree.status.summary(),
                },
            )
        )
        notes += await receipt
        running = await self.moves.move(
            task, S.RUNNING, action="task.run", fields={"refs": refs}, events=notes, before=record
        )
        return running, worktree.status

    async def _workspace(
        self,
        task: Task,
        resource: ResourceRef,
        repo_row: Repository,
        notes: list[audit.AuditEvent],
    ) -> tuple[SessionWorktree, dict[str, Any] | None]:
        """The repository's clone fresh enough and the session's worktree on its
        branch; returns the worktree and the task's refs (a pull request's, read now)."""
        branch = repo_row.default_branch
        checkout = await self.workspace.prepare_repo(
            resource.repo,
            repo_row.clone_url,
            branch,
            session=resource,
            branch_head=lambda: self._branch_head(resource, branch),
        )
        notes += await self._record_checkout(task, checkout)
        refs = task.refs
        pull = None
        if resource.kind is ResourceKind.PULL_REQUEST:
            pull, refs = await self._pull(resource, repo_row.clone_url)
        worktree = await self.workspace.prepare_session(
            resource, checkout, default_branch=branch, pull=pull
        )
        if refs is not None and pull is not None:
            refs["upstreamMoved"] = worktree.upstream_moved
        return worktree, refs

    async def _pull(
        self, resource: ResourceRef, clone_url: str
    ) -> tuple[PullRequestRefs, dict[str, Any]]:
        """A pull request's branches as Gitea has them now, and the task's refs."""
        p = await self.gitea.get_pull(resource.repo.owner, resource.repo.name, resource.number)
        head_repo = p["head"].get("repo") or {}
        pull = PullRequestRefs(
            number=resource.number,
            base_ref=p["base"]["ref"],
            head_ref=p["head"]["ref"],
            head_sha=p["head"]["sha"],
            head_clone_url=head_repo.get("clone_url") or clone_url,
        )
        refs = {
            "base": pull.base_ref,
            "head": pull.head_ref,
            "headSha": pull.head_sha,
            "headRepo": head_repo.get("full_name"),
        }
        return pull, refs

    async def turn_prompt(
        self,
        task: Task,
        resource: ResourceRef,
        cwd: str,
        markers: tuple[str, str],
        tool: CommentTool,
        prepared: Prepared,
        draft: bool,
    ) -> str:
        """The turn's prompt: the task, its workspace, its discussion and where its work
        goes. What the preparation measured in this same run is used, else (a retry)
        read again."""
        status = prepared.status or await self.workspace.worktree_status(cwd)
        refs = task.refs or {}
        title, discussion = await self._discussion(task, resource, prepared)
        publishing, last_push = "", None
        if not draft:
            publishing, last_push = await self._where_work_goes(task, resource)
        return prompt.turn_prompt(
            prompt.TurnContext(
                repo_full_name=resource.repo.full_name,
                resource_key=task.resource_key,
                kind=resource.kind.value,
                number=resource.number,
                author=task.author,
                instruction=task.instruction,
                workspace=cwd,
                branch=session_branch(resource),
                marker=markers[0],
                waiting_marker=markers[1],
                tool=tool.name,
                tool_arguments=tool.arguments,
                base_ref=refs.get("base"),
                head_ref=refs.get("head"),
                upstream_moved=bool(refs.get("upstreamMoved")),
                uncommitted=status.modified + status.untracked,
                discussion=discussion,
                title=title,
                publishing=publishing,
                last_push=last_push,
            ),
            draft=draft,
        )

    async def _discussion(
        self, task: Task, resource: ResourceRef, prepared: Prepared
    ) -> Discussion:
        """The discussion the preparation is fetching, else (a retry) fetched now."""
        if prepared.discussion is not None:
            return await prepared.discussion
        return await self.discussion(task, resource)

    async def _where_work_goes(self, task: Task, resource: ResourceRef) -> tuple[str, str | None]:
        """The prompt's lines on publishing: where the branch goes, and whether the
        session's last push was refused."""

        def read(c: Connection) -> tuple[Repository | None, pushes.Push | None]:
            return repos.get(c, task.repo_key), pushes.last(c, task.session_key)

        repo_row, last = await self.store.read(read)
        default = repo_row.default_branch if repo_row else "main"
        where = publish_rules.where_work_goes(
            publish_rules.target(resource, task.refs, default),
            default,
            publish_rules.PUSH_TOOL,
        )
        refused = None
        if last is not None and last.status == pushes.REFUSED:
            refused = f"the last push of your branch to {last.target} was refused: {last.error}"
        return where, refused

    async def _branch_head(self, resource: ResourceRef, branch: str) -> str | None:
        """Gitea's head of the default branch; None (then the clone is fetched) when
        Gitea cannot say."""
        try:
            return await self.gitea.branch_head(resource.repo.owner, resource.repo.name, branch)
        except GiteaError:
            return None

    async def _record_checkout(self, task: Task, checkout: RepoCheckout) -> list[audit.AuditEvent]:
        """A clone or fetch is recorded at once; a skipped fetch goes with the next move."""
        metadata: dict[str, Any] = {"path": checkout.path, "head": checkout.head}
        if checkout.action == "reused":
            if checkout.fetched_ago != float("inf"):
                metadata["fetchedSecondsAgo"] = round(checkout.fetched_ago, 1)
            return [task_event(task, "workspace.fetch_skipped", metadata=metadata)]
        action = "workspace.clone" if checkout.action == "cloned" else "workspace.fetch"
        event = task_event(task, action, metadata=metadata)

        def record(c: Connection) -> None:
            repos.mark_fetched(c, task.repo_key)
            audit.append(c, event)

        await self.store.write(record)
        return []

    async def discussion(self, task: Task, resource: ResourceRef) -> Discussion:
        """The issue's title and description and its recent comments, from Gitea.

        The bot's own comments and the comment that triggered this task are left out
        (the latter is shown on its own); a Gitea failure only costs the context.
        """
        owner, name, number = resource.repo.owner, resource.repo.name, resource.number
        try:
            issue, comments = await asyncio.gather(
                self.gitea.get_issue(owner, name, number),
                self.gitea.list_comments(owner, name, number),
            )
        except GiteaError as exc:
            await self.moves.audit(
                task, "prompt.discussion_unavailable", metadata={"error": str(exc)}
            )
            return None, []
        bot = self.bot_login.lower()
        thread = [(str((issue.get("user") or {}).get("login", "?")), str(issue.get("body") or ""))]
        for c in comments:
            login = str((c.get("user") or {}).get("login", "?"))
            if login.lower() == bot or c.get("id") == task.comment_id:
                continue
            thread.append((login, str(c.get("body") or "")))
        recent = [(who, body[:4000]) for who, body in thread if body.strip()][-10:]
        return str(issue.get("title") or "") or None, recent


def _all(units: list[Unit]) -> Unit:
    """One write of whatever ``units`` holds when it runs."""

    def write(c: Connection) -> None:
        for unit in units:
            unit(c)

    return write
