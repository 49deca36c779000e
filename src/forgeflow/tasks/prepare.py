"""The ``preparing`` step of a task (§5.3): workspace, receipt, prompt context.

The persistent clone and the session's worktree are made ready (DESIGN "Workspaces");
meanwhile the receipt is posted and the issue's discussion read from Gitea for the
prompt, so a warm task waits for the slowest of the three, not for their sum.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from sqlalchemy import Connection

from forgeflow.domain import modes
from forgeflow.domain.ids import ResourceKind, ResourceRef, parse_resource_key
from forgeflow.domain.states import TaskState
from forgeflow.gitea.client import GiteaClient, GiteaError
from forgeflow.store import Store, audit, repos
from forgeflow.store.db import Unit
from forgeflow.tasks.moves import TaskMoves, task_event
from forgeflow.tasks.replies import Replies
from forgeflow.workspace.manager import (
    GitAuthFailed,
    PullRequestRefs,
    RepoCheckout,
    WorkspaceDirty,
    WorkspaceError,
    WorkspaceManager,
    WorktreeStatus,
)

S = TaskState
Discussion = tuple[str | None, list[tuple[str, str]]]


class Preparer:
    def __init__(
        self,
        store: Store,
        workspace: WorkspaceManager,
        gitea: GiteaClient,
        replies: Replies,
        moves: TaskMoves,
        *,
        bot_login: str,
    ) -> None:
        self.store = store
        self.workspace = workspace
        self.gitea = gitea
        self.replies = replies
        self.moves = moves
        self.bot_login = bot_login
        # Per task, for the turn that follows in the same run: the worktree status
        # measured here, and the Gitea context being fetched meanwhile.
        self._status: dict[str, WorktreeStatus] = {}
        self._context: dict[str, asyncio.Task[Discussion]] = {}
        # Set while no task of this process is preparing: the outbox waits for it
        # (bounded) before it posts other tasks' receipts, which would compete with the
        # preparation for the one event-loop thread (see Scheduler._outbox_round).
        self.idle = asyncio.Event()
        self.idle.set()
        self._preparing: set[str] = set()

    def take_status(self, task_id: str) -> WorktreeStatus | None:
        return self._status.pop(task_id, None)

    def take_context(self, task_id: str) -> asyncio.Task[Discussion] | None:
        return self._context.pop(task_id, None)

    def expect(self, task_id: str) -> None:
        """A task was just claimed into ``preparing``: busy from now on, not from when
        its run gets to :meth:`prepare` (a verification waiting for :attr:`idle` must
        not slip in between)."""
        self._preparing.add(task_id)
        self.idle.clear()

    def _done(self, task_id: str) -> None:
        self._preparing.discard(task_id)
        if not self._preparing:
            self.idle.set()

    def forget(self, task_id: str) -> None:
        """The run of the task ended: drop what its turn did not take."""
        self._done(task_id)
        self._status.pop(task_id, None)
        leftover = self._context.pop(task_id, None)
        if leftover is not None:
            leftover.cancel()

    async def prepare(
        self, task: dict[str, Any], repo_row: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Move a ``preparing`` task to ``running``, ``blocked_workspace``, or a retry."""
        resource = parse_resource_key(task["resource_key"])
        if repo_row is None:
            repo_row = await self.store.read(lambda c: repos.get(c, task["repo_key"]))
        assert repo_row is not None
        self._context[task["task_id"]] = asyncio.create_task(self.discussion(task, resource))
        # The receipt's record goes with the move that ends this step: a commit less.
        record: list[Unit] = []
        receipt = asyncio.create_task(self._receipt(task, record))
        self.expect(task["task_id"])
        try:
            return await self._prepare(task, resource, repo_row, receipt, _all(record))
        finally:
            self._done(task["task_id"])
            if not receipt.done():
                receipt.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await receipt

    async def _prepare(
        self,
        task: dict[str, Any],
        resource: ResourceRef,
        repo_row: dict[str, Any],
        receipt: asyncio.Task[list[audit.AuditEvent]],
        record: Unit,
    ) -> dict[str, Any]:
        branch = repo_row["default_branch"]
        refs = task["refs"]
        # Rows of steps without an effect of their own, written with the next move.
        notes: list[audit.AuditEvent] = []
        try:
            checkout = await self.workspace.prepare_repo(
                resource.repo,
                repo_row["clone_url"],
                branch,
                session=resource,
                branch_head=lambda: self._branch_head(resource, branch),
            )
            notes += await self._record_checkout(task, checkout)
            pull = None
            if resource.kind is ResourceKind.PULL_REQUEST:
                p = await self.gitea.get_pull(
                    resource.repo.owner, resource.repo.name, resource.number
                )
                head_repo = p["head"].get("repo") or {}
                pull = PullRequestRefs(
                    number=resource.number,
                    base_ref=p["base"]["ref"],
                    head_ref=p["head"]["ref"],
                    head_sha=p["head"]["sha"],
                    head_clone_url=head_repo.get("clone_url") or repo_row["clone_url"],
                )
                refs = {
                    "base": pull.base_ref,
                    "head": pull.head_ref,
                    "headSha": pull.head_sha,
                    "headRepo": head_repo.get("full_name"),
                }
            worktree = await self.workspace.prepare_session(
                resource, checkout, default_branch=branch, pull=pull
            )
            if refs is not None and pull is not None:
                refs["upstreamMoved"] = worktree.upstream_moved
        except WorkspaceDirty as exc:
            return await self.moves.move(
                task,
                S.BLOCKED_WORKSPACE,
                action="task.block",
                error_code=exc.code,
                fields={"claimed_by": None},
                metadata={"detail": str(exc), **exc.details},
                events=notes + await receipt,
                before=record,
            )
        except (GitAuthFailed, WorkspaceError) as exc:
            return await self.moves.retry_or_fail(
                task, exc.code, str(exc), events=notes + await receipt, before=record
            )
        except GiteaError as exc:
            return await self.moves.retry_or_fail(
                task, "gitea_unavailable", str(exc), events=notes + await receipt, before=record
            )
        self._status[task["task_id"]] = worktree.status
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
        # The receipt is on Gitea (or its failure noted) before the turn can answer.
        notes += await receipt
        return await self.moves.move(
            task, S.RUNNING, action="task.run", fields={"refs": refs}, events=notes, before=record
        )

    async def _branch_head(self, resource: ResourceRef, branch: str) -> str | None:
        """Gitea's head of the default branch; None (then the clone is fetched) when
        Gitea cannot say."""
        try:
            return await self.gitea.branch_head(resource.repo.owner, resource.repo.name, branch)
        except GiteaError:
            return None

    async def _record_checkout(
        self, task: dict[str, Any], checkout: RepoCheckout
    ) -> list[audit.AuditEvent]:
        """A clone or fetch is recorded at once; a skipped fetch goes with the next move."""
        metadata: dict[str, Any] = {"path": checkout.path, "head": checkout.head}
        if checkout.action == "reused":
            if checkout.fetched_ago != float("inf"):
                metadata["fetchedSecondsAgo"] = round(checkout.fetched_ago, 1)
            return [task_event(task, "workspace.fetch_skipped", metadata=metadata)]
        action = "workspace.clone" if checkout.action == "cloned" else "workspace.fetch"
        event = task_event(task, action, metadata=metadata)

        def record(c: Connection) -> None:
            repos.mark_fetched(c, task["repo_key"])
            audit.append(c, event)

        await self.store.write(record)
        return []

    async def _receipt(self, task: dict[str, Any], record: list[Unit]) -> list[audit.AuditEvent]:
        if modes.is_draft(task.get("mode")):
            return []  # a review/plan (draft) task posts nothing on Gitea
        try:
            await self.replies.receipt(task, wait_in_flight=True, defer_record=record)
        except GiteaError as exc:
            return [
                task_event(
                    task,
                    "comment.receipt_failed",
                    error_code="gitea_unavailable",
                    metadata={"error": str(exc)},
                )
            ]
        return []

    async def discussion(self, task: dict[str, Any], resource: ResourceRef) -> Discussion:
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
            if login.lower() == bot or c.get("id") == task["comment_id"]:
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
