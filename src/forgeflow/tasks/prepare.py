"""The ``preparing`` step of a task: workspace, receipt, prompt context.

The repository's persistent clone is fetched when Gitea's branch moved, and the
session's worktree (one per issue or pull request, on its own branch) is made ready;
meanwhile the receipt is posted and the issue's discussion read from Gitea for the
prompt (``prompting.py``), so a warm task waits for the slowest of the three, not for
their sum; the move to ``running`` hands the turn its prompt's context. Only so
many preparations do their workspace work at once (FORGEFLOW_MAX_PREPARATIONS); the
others wait for a place, claimed and with their leases renewed. A failure
to make the workspace ready retries the task later (or fails it when its retries are
spent); a worktree with someone else's uncommitted work blocks it for an operator.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from dataclasses import dataclass
from functools import partial

from sqlalchemy import Connection

from forgeflow.domain import publish as rules
from forgeflow.domain.environment import ENVIRONMENT_SETUP_FAILED, tail
from forgeflow.domain.ids import ResourceKind, ResourceRef, parse_resource_key
from forgeflow.domain.json import JsonObject
from forgeflow.domain.paths import session_branch
from forgeflow.domain.records import Refs, Repository, Task
from forgeflow.domain.states import TaskState
from forgeflow.gitea.client import GiteaClient, GiteaError
from forgeflow.store import Store, audit, repos
from forgeflow.tasks import lost
from forgeflow.tasks.dispatch import Dispatcher
from forgeflow.tasks.environment import DefaultBranch, Environments
from forgeflow.tasks.moves import TaskMoves, task_event
from forgeflow.tasks.outbox import Outbox, Receipt
from forgeflow.tasks.prompting import Context, Conversation, Prompts
from forgeflow.workspace import mirror, published
from forgeflow.workspace.git import GitFailed, check_sha
from forgeflow.workspace.manager import (
    PullRequestRefs,
    RepoCheckout,
    SessionWorktree,
    WorkspaceDirty,
    WorkspaceError,
    WorkspaceManager,
)

S = TaskState


@dataclass(frozen=True, slots=True)
class Prepared:
    """What a preparation hands to the turn that follows it in the same run: the task's
    row after the step, and (when it reached ``running``) the prompt's context."""

    task: Task
    context: Context | None = None


class Preparer:
    def __init__(
        self,
        store: Store,
        workspace: WorkspaceManager,
        gitea: GiteaClient,
        outbox: Outbox,
        moves: TaskMoves,
        prompts: Prompts,
        slots: Dispatcher,
        environments: Environments | None = None,
    ) -> None:
        self.store = store
        self.workspace = workspace
        self.gitea = gitea
        self.outbox = outbox
        self.moves = moves
        self.prompts = prompts
        self.slots = slots
        self.environments = environments

    async def prepare(self, task: Task, repo_row: Repository | None = None) -> Prepared:
        """Move a ``preparing`` task to ``running``, ``blocked_workspace``, or a retry."""
        resource = parse_resource_key(task.resource_key)
        if repo_row is None:
            repo_row = await self.store.read(lambda c: repos.get(c, task.repo_key))
        assert repo_row is not None
        # Side by side with the workspace work: only requests to Gitea.
        discussion = asyncio.create_task(self.prompts.conversation(task, resource))
        receipt = asyncio.create_task(self.outbox.receipt(task, claimed=True))
        try:
            return await self._prepare(task, resource, repo_row, receipt, discussion)
        finally:
            for pending in (receipt, discussion):
                if not pending.done():  # the step failed before it waited for them
                    pending.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await pending

    async def _prepare(
        self,
        task: Task,
        resource: ResourceRef,
        repo_row: Repository,
        receipt: asyncio.Task[Receipt],
        discussion: asyncio.Task[Conversation],
    ) -> Prepared:
        """The workspace made ready, then the move that ends the step; the move waits
        for the receipt, so it is on Gitea (or its failure noted) before the turn, and
        writes the receipt's record (a commit less)."""
        # Rows of steps without an effect of their own, written with the next move.
        notes: list[audit.AuditEvent] = []
        try:
            # Within the bound on concurrent preparations (dispatch.Dispatcher); the
            # receipt and the discussion, only requests to Gitea, do not wait for it.
            async with self.slots.place():
                checkout = await self.workspace.prepare_repo(
                    resource.repo,
                    repo_row.clone_url,
                    repo_row.default_branch,
                    session=resource,
                    branch_head=lambda: self._branch_head(resource, repo_row.default_branch),
                )
                notes = await self._record_checkout(task, checkout)
                worktree, refs = await self._worktree(task, resource, repo_row, checkout)
        except (WorkspaceError, GiteaError) as exc:  # GitAuthFailed is a WorkspaceError
            return await self._not_prepared(task, exc, notes, await receipt)
        notes.append(_status_event(task, worktree))
        if worktree.created:  # made anew here: was the session's earlier disk lost?
            target = rules.target(resource, refs, repo_row.default_branch)
            notes += await self._lost(task, worktree, target.remote or target.local)
        if self.environments is not None:
            # The setup script and the tree it runs in as Gitea's default branch has
            # them, read from forgeflow's mirror: the clone is the agent's to rewrite.
            where = (self.workspace.git, self.workspace.mirror(resource.repo), checkout.head)
            branch = DefaultBranch(partial(mirror.file_at, *where), partial(mirror.archive, *where))
            ready = await self.environments.prepare(resource.repo, task.task_id, branch)
            notes += ready.events
            if ready.failed is not None:
                return await self._no_environment(task, ready.failed, notes, await receipt)
        posted = await receipt
        context = Context(worktree.status, await discussion)
        running = await self.moves.move(
            task,
            S.RUNNING,
            action="task.run",
            fields={"refs": refs},
            events=[*notes, *posted.events],
            before=posted.record,
        )
        return Prepared(running, context)

    async def _no_environment(
        self, task: Task, log: str, notes: list[audit.AuditEvent], posted: Receipt
    ) -> Prepared:
        """A build or setup that failed fails the task (not retried: the next mention
        runs it again only when something changed), its answer quoting the log."""
        failed = await self.moves.move(
            task,
            S.FAILED,
            action="task.fail",
            error_code=ENVIRONMENT_SETUP_FAILED,
            fields={"execution_error": tail(log)},
            events=[*notes, *posted.events],
            before=posted.record,
        )
        return Prepared(failed)

    async def _not_prepared(
        self,
        task: Task,
        exc: WorkspaceError | GiteaError,
        notes: list[audit.AuditEvent],
        posted: Receipt,
    ) -> Prepared:
        """The move after a preparation that failed: a dirty worktree blocks the task
        (an operator decides), anything else is retried or fails it."""
        events = [*notes, *posted.events]
        if isinstance(exc, WorkspaceDirty):
            blocked = await self.moves.move(
                task,
                S.BLOCKED_WORKSPACE,
                action="task.block",
                error_code=exc.code,
                metadata={"detail": str(exc), **exc.details},
                events=events,
                before=posted.record,
            )
            return Prepared(blocked)
        code = exc.code if isinstance(exc, WorkspaceError) else "gitea_unavailable"
        retried = await self.moves.retry_or_fail(
            task, code, str(exc), events=events, before=posted.record
        )
        return Prepared(retried)

    async def _worktree(
        self, task: Task, resource: ResourceRef, repo_row: Repository, checkout: RepoCheckout
    ) -> tuple[SessionWorktree, Refs | None]:
        """The session's worktree on its branch, and the task's refs (a pull request's,
        read now)."""
        pull, found = None, None
        if resource.kind is ResourceKind.PULL_REQUEST:
            pull, found = await self._pull(resource, repo_row.clone_url)
        worktree = await self.workspace.prepare_session(
            resource,
            checkout,
            default_branch=repo_row.default_branch,
            pull=pull,
            published_head=partial(self._session_head, resource),
        )
        if found is None:
            return worktree, task.refs
        return worktree, dataclasses.replace(found, upstream_moved=worktree.upstream_moved)

    async def _lost(
        self, task: Task, worktree: SessionWorktree, branch: str
    ) -> list[audit.AuditEvent]:
        """``session.work_lost`` when the session last ran on a dead worker (lost.py)."""
        owner, ttl = self.slots.owner, self.slots.lease_ttl
        published = worktree.published
        event = await self.store.read(
            lambda c: lost.lost_event(
                c, task, owner=owner, ttl=ttl, branch=branch, published=published
            )
        )
        return [event] if event is not None else []

    async def _pull(self, resource: ResourceRef, clone_url: str) -> tuple[PullRequestRefs, Refs]:
        """A pull request's branches as Gitea has them now, and the task's refs."""
        p = await self.gitea.pull(resource.repo.owner, resource.repo.name, resource.number)
        head_repo = p.head.repo
        pull = PullRequestRefs(
            number=resource.number,
            base_ref=p.base.ref,
            head_ref=p.head.ref,
            head_sha=p.head.sha,
            head_clone_url=(head_repo.clone_url if head_repo else "") or clone_url,
        )
        refs = Refs(
            base=pull.base_ref,
            head=pull.head_ref,
            head_sha=pull.head_sha,
            head_repo=head_repo.full_name if head_repo else None,
        )
        return pull, refs

    async def _branch_head(self, resource: ResourceRef, branch: str) -> str | None:
        """Gitea's head of the default branch; None (then the clone is fetched) when
        Gitea cannot say."""
        try:
            return await self.gitea.branch_head(resource.repo.owner, resource.repo.name, branch)
        except GiteaError:
            return None

    async def _session_head(self, resource: ResourceRef) -> published.Said | None:
        """Gitea's head of the session's branch (Said(None): no such branch); None when
        Gitea cannot say, and then the branch is fetched."""
        repo = resource.repo
        try:
            sha = await self.gitea.branch_head(repo.owner, repo.name, session_branch(resource))
        except GiteaError as exc:
            return published.Said(None) if exc.status == 404 else None
        try:
            return published.Said(check_sha(sha, "session branch head"))
        except GitFailed:
            return None

    async def _record_checkout(self, task: Task, checkout: RepoCheckout) -> list[audit.AuditEvent]:
        """A clone or fetch is recorded at once; a skipped fetch goes with the next move."""
        metadata: JsonObject = {"path": checkout.path, "head": checkout.head}
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


def _status_event(task: Task, worktree: SessionWorktree) -> audit.AuditEvent:
    return task_event(
        task,
        "workspace.status",
        metadata={
            "path": worktree.path,
            "branch": worktree.branch,
            "upstreamMoved": worktree.upstream_moved,
            "status": worktree.status.summary(),
        },
    )
