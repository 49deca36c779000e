"""The task flow: ``preparing`` → ``running`` → ``verifying_reply`` → terminal (§5.2–5.4).

One :class:`Execution` drives one claimed task through its steps; the preparing step
is ``preparing.py``'s. Every state change goes through the store's transition
function; every side effect (clone, turn, comment) is recorded before and after it
happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

import structlog
from sqlalchemy import Connection

from forgeflow.agent.port import (
    AgentError,
    AgentRuntime,
    CommentTool,
    NeedsUser,
    SessionSpec,
    TurnCompleted,
    TurnHandle,
    TurnSpec,
    TurnStatus,
)
from forgeflow.domain import prompt
from forgeflow.domain import publish as publish_rules
from forgeflow.domain.ids import parse_resource_key, turn_key
from forgeflow.domain.markers import Marker, MarkerKind, parse_marker
from forgeflow.domain.paths import session_branch, session_worktree
from forgeflow.domain.retry import RetryPolicy
from forgeflow.domain.states import TaskState
from forgeflow.gitea.client import GiteaClient, GiteaError
from forgeflow.store import Store, leases, pushes, repos, sessions
from forgeflow.store import comments as comment_q
from forgeflow.store import tasks as task_q
from forgeflow.store import turns as turn_q
from forgeflow.store.types import utcnow
from forgeflow.store.usage import Budgets
from forgeflow.tasks import drafts
from forgeflow.tasks.moves import TaskMoves
from forgeflow.tasks.prepare import Preparer
from forgeflow.tasks.publish import Outcome, Publisher
from forgeflow.tasks.replies import Found, Replies, Verification
from forgeflow.tasks.turn import TurnFollower
from forgeflow.workspace.manager import WorkspaceManager

log = structlog.get_logger("forgeflow.tasks.run")

S = TaskState
_HOLDS_LEASE = frozenset({S.PREPARING, S.RUNNING, S.ABORTING})
# At most this long a finished turn's verification lets preparing tasks go first.
_VERIFY_DEFER_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class ExecutionConfig:
    owner: str
    workspace_root: str
    bot_login: str
    lease_ttl: timedelta
    retry: RetryPolicy
    abort_timeout: float = 30.0
    budgets: Budgets = dataclasses.field(default_factory=Budgets)


class Execution:
    def __init__(
        self,
        cfg: ExecutionConfig,
        store: Store,
        workspace: WorkspaceManager,
        gitea: GiteaClient,
        replies: Replies,
        runtime: AgentRuntime,
        publisher: Publisher | None = None,
    ) -> None:
        self.cfg = cfg
        self.publisher = publisher
        self.store = store
        self.workspace = workspace
        self.gitea = gitea
        self.replies = replies
        self.runtime = runtime
        self.moves = TaskMoves(store, cfg.retry)
        self.preparer = Preparer(
            store, workspace, gitea, replies, self.moves, bot_login=cfg.bot_login
        )
        self.follower = TurnFollower(store, runtime, cfg.abort_timeout, cfg.budgets)
        # Per task: the normal turn that just ended in this run, as its row would say
        # (the verification that follows needs no read of it).
        self._ended: dict[str, dict[str, Any]] = {}
        # Per task: what publishing did after its turn, for the answer's note.
        self._published: dict[str, Outcome] = {}

    # -- plumbing ---------------------------------------------------------------

    async def _move(self, task: dict[str, Any], to: TaskState, **kw: Any) -> dict[str, Any]:
        return await self.moves.move(task, to, **kw)

    async def _audit(self, task: dict[str, Any], action: str, **kw: Any) -> None:
        await self.moves.audit(task, action, **kw)

    async def _retry_or_fail(
        self, task: dict[str, Any], code: str, detail: str, *, step: TaskState = S.PREPARING
    ) -> dict[str, Any]:
        return await self.moves.retry_or_fail(task, code, detail, step=step)

    async def _heartbeat(self, repo_key: str, lease_id: str) -> None:
        ttl = self.cfg.lease_ttl
        while True:
            await asyncio.sleep(ttl.total_seconds() / 3)
            if not await self.store.write(lambda c: leases.renew(c, repo_key, lease_id, ttl)):
                log.warning("lease.lost", repo_key=repo_key, lease_id=lease_id)
                return

    # -- entry --------------------------------------------------------------------

    async def run(
        self,
        task: dict[str, Any],
        *,
        repo: dict[str, Any] | None = None,
        session: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Drive a just-claimed task as far as it goes now; return its last row.

        ``repo``, ``session``: its repository and session rows when the claim read them
        (else they are read here)."""
        beat = None
        if task.get("lease_id"):
            beat = asyncio.create_task(self._heartbeat(task["repo_key"], task["lease_id"]))
        try:
            if task["state"] == S.PREPARING:
                task = await self.preparer.prepare(task, repo)
            if task["state"] == S.RUNNING:
                task = await self._turn(task, session)
            if beat is not None and task["state"] not in _HOLDS_LEASE:
                # The move out of the active states gave the lease back: nothing to renew.
                beat.cancel()
            if task["state"] == S.VERIFYING_REPLY:
                await self._publish(task)
                await self._after_preparing()
                task = await self._verify(task)
            return task
        finally:
            self.preparer.forget(task["task_id"])
            self._ended.pop(task["task_id"], None)
            self._published.pop(task["task_id"], None)
            if beat is not None:
                beat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beat

    async def _publish(self, task: dict[str, Any]) -> None:
        """Push what the agent committed in this turn (recorded; a refusal fails no
        task, the next turn's prompt says so). Drafts publish nothing."""
        if self.publisher is not None and not drafts.is_draft(task):
            self._published[task["task_id"]] = await self.publisher.publish(task)

    async def _after_preparing(self) -> None:
        """Let the tasks this process prepares go first (bounded): the next task of the
        repository was claimed when this one gave its lease back, and its turn waits
        for its preparation; this task's verification (a Gitea read and a commit) only
        delays its own ``succeeded``."""
        idle = self.preparer.idle
        if not idle.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_VERIFY_DEFER_SECONDS):
                    await idle.wait()

    # -- running -------------------------------------------------------------------

    async def _turn(
        self, task: dict[str, Any], session: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        resource = parse_resource_key(task["resource_key"])
        if session is None:
            session = await self.store.read(lambda c: sessions.get(c, task["session_key"]))
        assert session is not None
        cwd = session_worktree(self.cfg.workspace_root, resource)
        reply_retry = task["retry_step"] == S.RUNNING and int(task["reply_attempt"]) > 0
        draft = drafts.is_draft(task)  # review/plan space: read-only, posts nothing
        if not draft and not reply_retry and int(task["turn_count"]) > 0:
            # A turn of this task ran before and was interrupted: if its answer reached
            # Gitea before the interruption, it is the answer; no second turn.
            answered = await self._answered_before(task)
            if answered is not None:
                return answered
        try:
            tool = drafts.NO_TOOL if draft else await self.runtime.comment_tool()
            thread_id = await self.runtime.ensure_session(
                SessionSpec(
                    session_key=task["session_key"],
                    thread_id=session["thread_id"],
                    cwd=cwd,
                    owner=resource.repo.owner,
                    repo=resource.repo.name,
                    developer_instructions=prompt.DRAFT_DEVELOPER_INSTRUCTIONS
                    if draft
                    else prompt.DEVELOPER_INSTRUCTIONS,
                    read_only=draft,
                )
            )
        except AgentError as exc:
            return await self._agent_failed(task, exc)
        bound_at = utcnow()
        n = int(task["turn_count"]) + 1
        key = turn_key(task["task_id"], n)
        verified_key = key
        if reply_retry:
            normal = await self.store.read(lambda c: turn_q.last_normal(c, task["task_id"]))
            verified_key = normal["turn_key"] if normal else key
        final = Marker(task["task_id"], verified_key, task["resource_key"], MarkerKind.FINAL)
        marker = final.render()
        waiting = dataclasses.replace(final, state="waiting_user").render()
        if reply_retry:
            text = prompt.reply_retry_prompt(marker, tool.name, tool.arguments)
        else:
            text = await self._prompt(task, resource, cwd, (marker, waiting), tool, draft=draft)
        kind = "reply_retry" if reply_retry else "normal"

        def begin(c: Connection) -> None:
            # The thread binding and the turn's intent, one commit before turn/start.
            turn_q.bind_thread(
                c,
                task["session_key"],
                thread_id,
                task_id=task["task_id"],
                resumed=session["thread_id"] == thread_id,
                at=bound_at,
            )
            turn_q.begin(c, turn_key=key, task_id=task["task_id"], thread_id=thread_id, kind=kind)

        await self.store.write(begin)
        spec = TurnSpec(
            task_id=task["task_id"],
            turn_key=key,
            prompt=text,
            kind=kind,
            marker="" if draft else marker,
            owner=resource.repo.owner,
            repo=resource.repo.name,
            number=resource.number,
            read_only=draft,
        )
        try:
            handle = await self.runtime.start_turn(thread_id, spec)
        except AgentError as exc:
            await self.store.write(lambda c: turn_q.finish(c, key, "failed", None))
            return await self._agent_failed(task, exc)
        await self.store.write(
            lambda c: turn_q.started(
                c,
                turn_key=key,
                turn_id=handle.turn_id,
                task_id=task["task_id"],
                session_key=task["session_key"],
            )
        )
        completed, needs_user, aborted = await self.follower.follow(task, key, handle)

        def finish(c: Connection) -> dict[str, Any] | None:
            if completed is not None:
                turn_q.event_seen(c, turn_key=key, seq=completed.seq)
            turn_q.finish(
                c,
                key,
                completed.status.value if completed else "failed",
                completed.last_message if completed else None,
            )
            return task_q.get(c, task["task_id"])  # fresh: an abort may have come meanwhile

        if (
            completed is not None
            and completed.status is TurnStatus.COMPLETED
            and not (needs_user or aborted)
        ):
            # The common end: the turn's record, the move to verifying_reply, the lease
            # given back and the repository's next task claimed, in one transaction;
            # unless an abort moved the task meanwhile (then only the turn's record).
            moved = await self._move(
                task,
                S.VERIFYING_REPLY,
                action="task.verify",
                fields={"turn_id": handle.turn_id, "retry_step": None},
                before=finish,
                unless_moved=True,
            )
            if moved["state"] == S.VERIFYING_REPLY and (
                moved["state_version"] == task["state_version"] + 1
            ):
                if kind == "normal":
                    self._ended[task["task_id"]] = {
                        "turn_key": key,
                        "turn_id": handle.turn_id,
                        "last_message": completed.last_message,
                    }
                return moved
            return await self._after_turn(moved, handle, completed, needs_user, aborted)
        fresh = await self.store.write(finish)
        assert fresh is not None
        return await self._after_turn(fresh, handle, completed, needs_user, aborted)

    async def _answered_before(self, task: dict[str, Any]) -> dict[str, Any] | None:
        last = await self.store.read(lambda c: turn_q.last_normal(c, task["task_id"]))
        if last is None:
            return None
        found = await self.replies.verify(task, last["turn_key"])
        if found.result is not Found.FOUND:
            return None
        await self._audit(
            task,
            "turn.skipped_answer_exists",
            comment_id=found.comment_id,
            metadata={"turnKey": last["turn_key"]},
        )
        return await self._move(
            task,
            S.VERIFYING_REPLY,
            action="task.verify",
            fields={"turn_id": last["turn_id"], "retry_step": None},
        )

    async def _prompt(
        self,
        task: dict[str, Any],
        resource: Any,
        cwd: str,
        markers: tuple[str, str],
        tool: CommentTool,
        *,
        draft: bool = False,
    ) -> str:
        # Fresh from preparing in this same run, else (a retry) read again.
        status = self.preparer.take_status(task["task_id"]) or (
            await self.workspace.worktree_status(cwd)
        )
        refs = task["refs"] or {}
        pending = self.preparer.take_context(task["task_id"])
        title, discussion = await (pending or self.preparer.discussion(task, resource))
        publishing, last_push = "", None
        if not draft:
            publishing, last_push = await self._where_work_goes(task, resource)
        return prompt.turn_prompt(
            prompt.TurnContext(
                repo_full_name=resource.repo.full_name,
                resource_key=task["resource_key"],
                kind=resource.kind.value,
                number=resource.number,
                author=task["author"],
                instruction=task["instruction"],
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

    async def _where_work_goes(self, task: dict[str, Any], resource: Any) -> tuple[str, str | None]:
        """The prompt's lines on publishing: where the branch goes, and whether the
        session's last push was refused."""

        def read(c: Connection) -> tuple[dict[str, Any] | None, pushes.Push | None]:
            return repos.get(c, task["repo_key"]), pushes.last(c, task["session_key"])

        repo_row, last = await self.store.read(read)
        default = repo_row["default_branch"] if repo_row else "main"
        where = publish_rules.where_work_goes(
            publish_rules.target(resource, task["refs"], default),
            default,
            publish_rules.PUSH_TOOL,
        )
        refused = None
        if last is not None and last.status == pushes.REFUSED:
            refused = f"the last push of your branch to {last.target} was refused: {last.error}"
        return where, refused

    async def _after_turn(
        self,
        task: dict[str, Any],
        handle: TurnHandle,
        completed: TurnCompleted | None,
        needs_user: NeedsUser | None,
        aborted: bool,
    ) -> dict[str, Any]:
        if task["state"] == S.ABORTING:
            if completed is None:
                return await self._move(
                    task,
                    S.FAILED,
                    action="task.abort_timeout",
                    error_code="abort_timeout",
                    fields={"claimed_by": None, "execution_error": "turn did not stop in time"},
                )
            return await self._move(
                task, S.ABORTED, action="task.aborted", fields={"claimed_by": None}
            )
        if completed is None:
            return await self._retry_or_fail(
                task, "app_server_timeout", "the turn ended without turn/completed"
            )
        if completed.status is TurnStatus.COMPLETED:
            if needs_user is not None and not drafts.is_draft(task):
                # (A draft posts no question: its final message is its answer.)
                try:
                    if needs_user.question:
                        await self.replies.question(task, needs_user.question)
                except GiteaError as exc:
                    await self._audit(task, "comment.question_failed", metadata={"error": str(exc)})
                return await self._move(
                    task,
                    S.WAITING_USER,
                    action="task.wait_user",
                    fields={"claimed_by": None, "retry_step": None},
                )
            return await self._move(
                task,
                S.VERIFYING_REPLY,
                action="task.verify",
                fields={"turn_id": handle.turn_id, "retry_step": None},
            )
        if completed.status is TurnStatus.INTERRUPTED:
            return await self._retry_or_fail(
                task, "interrupted_by_restart", completed.error or "turn interrupted"
            )
        code = completed.error_code or "turn_failed"
        return await self._retry_or_fail(task, code, completed.error or code)

    async def _agent_failed(self, task: dict[str, Any], exc: AgentError) -> dict[str, Any]:
        if exc.retryable:
            return await self._retry_or_fail(task, exc.code, str(exc))
        return await self._move(
            task,
            S.FAILED,
            action="task.fail",
            error_code=exc.code,
            fields={"execution_error": str(exc), "claimed_by": None},
        )

    # -- verifying_reply ------------------------------------------------------------

    async def _verify(self, task: dict[str, Any]) -> dict[str, Any]:
        if drafts.is_draft(task):
            return await drafts.confirm(self.store, self.moves, task)
        turn = self._ended.pop(task["task_id"], None) or await self.store.read(
            lambda c: turn_q.last_normal(c, task["task_id"])
        )
        if turn is None:
            return await self._move(
                task,
                S.FAILED_REPLY,
                action="reply.fail",
                error_code="no_turn",
                fields={"reply_error": "no turn"},
            )
        result = await self.replies.verify(task, turn["turn_key"])
        if result.result is Found.FOUND:
            await self._note_publishing(task, result)
            return await self._move(
                task,
                S.SUCCEEDED,
                action="reply.confirm",
                fields={"claimed_by": None},
                metadata={"commentId": result.comment_id},
                before=partial(
                    comment_q.record_final,
                    task=task,
                    turn_key=turn["turn_key"],
                    turn_id=turn["turn_id"],
                    comment_id=result.comment_id,
                ),
            )
        if result.result is Found.UNKNOWN:
            return await self._move(
                task,
                S.FAILED_REPLY,
                action="reply.fail",
                error_code="reply_unknown",
                fields={"reply_error": result.detail, "claimed_by": None},
            )
        if int(task["reply_attempt"]) == 0:
            return await self._move(
                task,
                S.RETRY_WAIT,
                action="reply.retry",
                error_code="mcp_reply_missing",
                fields={
                    "reply_attempt": 1,
                    "retry_step": "running",
                    "next_retry_at": utcnow(),
                    "claimed_by": None,
                    "reply_error": "mcp_reply_missing",
                },
            )
        return await self._fallback(task, turn)

    async def _note_publishing(self, task: dict[str, Any], found: Verification) -> None:
        """The answer says what happened to the work: pushed where, or refused why."""
        outcome = self._published.get(task["task_id"])
        note = outcome.note() if outcome is not None else None
        marker = parse_marker(found.body or "")
        if note is None or marker is None or marker.kind is not MarkerKind.FINAL:
            return
        if await self.replies.add_note(task, found, note):
            await self._audit(task, "reply.publish_note", comment_id=found.comment_id)
        else:
            await self._audit(task, "reply.publish_note_failed", comment_id=found.comment_id)

    async def _fallback(self, task: dict[str, Any], turn: dict[str, Any]) -> dict[str, Any]:
        text = turn["last_message"] or "(the agent finished without an answer text)"
        try:
            await self.replies.fallback(task, turn["turn_key"], text)
        except GiteaError as exc:
            return await self._move(
                task,
                S.FAILED_REPLY,
                action="reply.fail",
                error_code="rest_fallback_failed",
                fields={"reply_error": f"mcp_reply_missing; fallback: {exc}", "claimed_by": None},
            )
        check = await self.replies.verify(task, turn["turn_key"])
        if check.result is not Found.FOUND:
            return await self._move(
                task,
                S.FAILED_REPLY,
                action="reply.fail",
                error_code="rest_fallback_unconfirmed",
                fields={
                    "reply_error": "mcp_reply_missing; fallback posted but not found",
                    "claimed_by": None,
                },
            )
        return await self._move(
            task,
            S.SUCCEEDED_WITH_REST_FALLBACK,
            action="reply.fallback",
            error_code="mcp_reply_missing",
            fields={"reply_error": "mcp_reply_missing", "claimed_by": None},
            metadata={"commentId": check.comment_id},
        )
