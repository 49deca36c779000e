"""The ``running`` step of a task: one agent turn, from its prompt to its end.

The turn's intent is recorded before ``turn/start`` and its end with the task's next
move (one commit), so a crash at any point leaves a record the next attempt reads: a
turn whose answer already reached Gitea is not run again (``verify.py`` decides that,
and whether this turn is a reply retry); its prompt is ``prompting.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial

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
from forgeflow.domain import options, prompt
from forgeflow.domain.ids import ResourceRef, parse_resource_key
from forgeflow.domain.paths import session_worktree
from forgeflow.domain.records import Session, Task
from forgeflow.domain.states import TaskState
from forgeflow.gitea.client import GiteaError
from forgeflow.store import Store, sessions
from forgeflow.store import tasks as task_q
from forgeflow.store import turns as turn_q
from forgeflow.store.types import utcnow
from forgeflow.tasks import drafts, reviews
from forgeflow.tasks.follow import TurnFollower
from forgeflow.tasks.moves import TaskMoves
from forgeflow.tasks.prompting import Context, Prompts, TurnPlan
from forgeflow.tasks.replies import Replies
from forgeflow.tasks.review_prompt import ReviewPrompts, review_session
from forgeflow.tasks.thread_keep import ThreadKeeper
from forgeflow.tasks.verify import EndedTurn, Verifier

S = TaskState


@dataclass(frozen=True, slots=True)
class _End:
    """How a started turn ended, as its runtime and the abort watch saw it."""

    handle: TurnHandle
    completed: TurnCompleted | None
    needs_user: NeedsUser | None
    aborted: bool
    capped: bool = False  # the task's own token cap interrupted it

    @property
    def answered(self) -> bool:
        """The turn completed with an answer to verify (no question, no abort)."""
        return (
            self.completed is not None
            and self.completed.status is TurnStatus.COMPLETED
            and not (self.needs_user or self.aborted)
        )


class TurnRunner:
    def __init__(
        self,
        store: Store,
        runtime: AgentRuntime,
        replies: Replies,
        moves: TaskMoves,
        prompts: Prompts,
        verifier: Verifier,
        follower: TurnFollower,
        *,
        workspace_root: str,
        review_prompts: ReviewPrompts | None = None,
    ) -> None:
        self.review_prompts = review_prompts  # a pull request review task's prompt
        self.store = store
        self.runtime = runtime
        self.replies = replies
        self.moves = moves
        self.prompts = prompts
        self.verifier = verifier
        self.follower = follower
        self.workspace_root = workspace_root
        self.threads = ThreadKeeper(
            store,
            runtime,
            prompts.workspace.jail,
            moves,
            prompts.gitea,
            prompts.bot_login,
            prompts.threads,
        )

    async def run(
        self, task: Task, session: Session | None, context: Context | None
    ) -> tuple[Task, EndedTurn | None]:
        """Run the task's turn; return the task's row after it, and the turn as its row
        would say when it was a normal turn that ended for verification (the
        verification then needs no read of it). ``context``: the prompt's context, read
        by the preparation in this same run."""
        resource = parse_resource_key(task.resource_key)
        if session is None:
            session = await self.store.read(lambda c: sessions.get(c, task.session_key))
        assert session is not None
        cwd = session_worktree(self.workspace_root, resource)
        draft = drafts.is_draft(task)  # review/plan space: read-only, posts nothing
        review = reviews.is_review(task)  # a pull request review: read-only, one review
        answered = await self.verifier.answered_before(task)
        if answered is not None:
            return answered, None
        try:
            tool = drafts.NO_TOOL if draft or review else await self.runtime.comment_tool()
            thread_id = await self._session(task, session, resource, cwd, draft=draft)
        except AgentError as exc:
            return await self._agent_failed(task, exc), None
        bound_at = utcnow()
        if review and self.review_prompts is not None:
            planned = await self._review_plan(task)
            if isinstance(planned, Task):  # the pull request could not be read
                return planned, None
            plan = planned
        else:
            plan = await self._session_plan(
                task, session, resource, cwd, thread_id, tool, context, draft=draft
            )
        await self.store.write(_begin(task, session, thread_id, plan, bound_at, bind=not review))
        spec = _turn_spec(task, plan, resource, read_only=draft or review)
        try:
            handle = await self.runtime.start_turn(thread_id, spec)
        except AgentError as exc:
            await self.store.write(lambda c: turn_q.finish(c, plan.key, "failed", None))
            return await self._agent_failed(task, exc), None
        await self.store.write(
            lambda c: turn_q.started(
                c,
                turn_key=plan.key,
                turn_id=handle.turn_id,
                task_id=task.task_id,
                session_key=task.session_key,
            )
        )
        end = _End(handle, *await self.follower.follow(task, plan.key, handle))
        if not (draft or review):  # a read-only thread is never resumed: nothing to keep
            # (a review's would replace the kept thread of its pull request's session)
            await self.threads.keep(task, resource, thread_id, plan.key)
        return await self._end(task, plan, end)

    async def _review_plan(self, task: Task) -> TurnPlan | Task:
        """A pull request review's turn, from the pull request as Gitea has it now; when
        Gitea cannot be read, the task's row after its retry or failure instead."""
        assert self.review_prompts is not None
        try:
            return await self.review_prompts.plan(task)
        except GiteaError as exc:
            return await self.moves.retry_or_fail(task, "gitea_unavailable", str(exc))

    async def _session_plan(
        self,
        task: Task,
        session: Session,
        resource: ResourceRef,
        cwd: str,
        thread_id: str,
        tool: CommentTool,
        context: Context | None,
        *,
        draft: bool,
    ) -> TurnPlan:
        """A session's turn: a reply retry's, or one on a thread rebuilt from the
        session's history when its kept thread could not be resumed."""
        answer_of = await self.verifier.answer_of(task)  # a reply retry's turn
        rebuilt = None
        if session.thread_id and thread_id != session.thread_id and not draft:
            rebuilt = await self.threads.rebuilt(task, resource, cwd, session.thread_id, thread_id)
        return await self.prompts.plan(
            task,
            resource,
            cwd,
            tool,
            context,
            answer_of=answer_of,
            draft=draft,
            rebuilt=rebuilt,
        )

    async def _session(
        self,
        task: Task,
        session: Session,
        resource: ResourceRef,
        cwd: str,
        *,
        draft: bool,
    ) -> str:
        """The agent's thread of the session, resumed or started; returns its id. A
        review gets a read-only thread of its own (the session's stays as it is)."""
        if reviews.is_review(task):
            return await self.runtime.ensure_session(review_session(task, resource, cwd))
        return await self.runtime.ensure_session(
            SessionSpec(
                session_key=task.session_key,
                thread_id=session.thread_id,
                cwd=cwd,
                owner=resource.repo.owner,
                repo=resource.repo.name,
                developer_instructions=prompt.DRAFT_DEVELOPER_INSTRUCTIONS
                if draft
                else prompt.DEVELOPER_INSTRUCTIONS,
                read_only=draft,
                kept=partial(self.threads.kept, task.session_key, session.thread_id)
                if session.thread_id
                else None,
            )
        )

    async def _end(self, task: Task, plan: TurnPlan, end: _End) -> tuple[Task, EndedTurn | None]:
        """Record the turn's end with the task's next move."""
        completed = end.completed

        def finish(c: Connection) -> Task | None:
            if completed is not None:
                turn_q.event_seen(c, turn_key=plan.key, seq=completed.seq)
            turn_q.finish(
                c,
                plan.key,
                completed.status.value if completed else "failed",
                completed.last_message if completed else None,
            )
            return task_q.get(c, task.task_id)  # fresh: an abort may have come meanwhile

        if not end.answered:
            fresh = await self.store.write(finish)
            assert fresh is not None
            return await self._after_turn(fresh, end), None
        assert completed is not None
        # The common end: the turn's record, the move to verifying_reply, the lease
        # given back and the repository's next task claimed, in one transaction;
        # unless an abort moved the task meanwhile (then only the turn's record).
        moved = await self.moves.move(
            task,
            S.VERIFYING_REPLY,
            action="task.verify",
            fields={"turn_id": end.handle.turn_id, "retry_step": None},
            before=finish,
            unless_moved=True,
        )
        if moved.state != S.VERIFYING_REPLY or moved.state_version != (task.state_version + 1):
            return await self._after_turn(moved, end), None
        if plan.kind != "normal":
            return moved, None
        return moved, EndedTurn(plan.key, end.handle.turn_id, completed.last_message)

    async def _after_turn(self, task: Task, end: _End) -> Task:
        """The task's move after a turn that did not simply end with an answer."""
        completed = end.completed
        if task.state == S.ABORTING:
            if completed is None:
                return await self.moves.move(
                    task,
                    S.FAILED,
                    action="task.abort_timeout",
                    error_code="abort_timeout",
                    fields={"execution_error": "turn did not stop in time"},
                )
            return await self.moves.move(task, S.ABORTED, action="task.aborted")
        if end.capped and (completed is None or completed.status is not TurnStatus.COMPLETED):
            return await self._capped(task)
        if completed is None:
            return await self.moves.retry_or_fail(
                task, "app_server_timeout", "the turn ended without turn/completed"
            )
        if completed.status is TurnStatus.COMPLETED:
            if end.needs_user is not None and not drafts.is_draft(task):
                # (A draft posts no question: its final message is its answer.)
                return await self._ask_user(task, end.needs_user)
            return await self.moves.move(
                task,
                S.VERIFYING_REPLY,
                action="task.verify",
                fields={"turn_id": end.handle.turn_id, "retry_step": None},
            )
        if completed.status is TurnStatus.INTERRUPTED:
            return await self.moves.retry_or_fail(
                task, "interrupted_by_restart", completed.error or "turn interrupted"
            )
        code = completed.error_code or "turn_failed"
        return await self.moves.retry_or_fail(task, code, completed.error or code)

    async def _capped(self, task: Task) -> Task:
        """The task's ``--max-tokens`` stopped its turn: failed as over a budget, no
        retry (another try would spend past the cap again)."""
        assert task.max_tokens is not None
        return await self.moves.move(
            task,
            S.FAILED,
            action="task.fail",
            error_code="budget_exceeded",
            fields={"execution_error": options.cap_text(task.max_tokens)},
        )

    async def _ask_user(self, task: Task, needs_user: NeedsUser) -> Task:
        """Post the agent's question (unless it posted it itself) and wait for the user."""
        try:
            if needs_user.question:
                await self.replies.question(task, needs_user.question)
        except GiteaError as exc:
            await self.moves.audit(task, "comment.question_failed", metadata={"error": str(exc)})
        return await self.moves.move(
            task,
            S.WAITING_USER,
            action="task.wait_user",
            fields={"retry_step": None},
        )

    async def _agent_failed(self, task: Task, exc: AgentError) -> Task:
        if exc.retryable:
            return await self.moves.retry_or_fail(task, exc.code, str(exc))
        return await self.moves.move(
            task,
            S.FAILED,
            action="task.fail",
            error_code=exc.code,
            fields={"execution_error": str(exc)},
        )


def _turn_spec(task: Task, plan: TurnPlan, resource: ResourceRef, *, read_only: bool) -> TurnSpec:
    """What the runtime is asked to run; a read-only turn (a draft space's or a review's)
    posts no answer, so it carries no marker."""
    return TurnSpec(
        task_id=task.task_id,
        turn_key=plan.key,
        prompt=plan.prompt,
        kind=plan.kind,
        marker="" if read_only else plan.marker,
        owner=resource.repo.owner,
        repo=resource.repo.name,
        number=resource.number,
        read_only=read_only,
        model=task.model,
        images=plan.images,
    )


def _begin(
    task: Task,
    session: Session,
    thread_id: str,
    plan: TurnPlan,
    bound_at: datetime,
    *,
    bind: bool = True,
) -> Callable[[Connection], None]:
    """The thread binding (``bind``: not for a review's own thread) and the turn's
    intent, one commit before ``turn/start``."""

    def begin(c: Connection) -> None:
        if bind:
            turn_q.bind_thread(
                c,
                task.session_key,
                thread_id,
                task_id=task.task_id,
                resumed=session.thread_id == thread_id,
                at=bound_at,
            )
        turn_q.begin(
            c, turn_key=plan.key, task_id=task.task_id, thread_id=thread_id, kind=plan.kind
        )

    return begin
