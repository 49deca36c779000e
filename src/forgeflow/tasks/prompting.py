"""Every prompt a task's turn is given, and the context it is built from.

A normal turn's prompt says what the task is (its instruction, its issue or pull
request), where it works (the session's worktree and branch, what is uncommitted), what
was said (the issue's discussion, read from Gitea) and where its work goes (the push
target, a refused last push). A reply retry's prompt only asks the agent to post the
answer it already gave (the missing-reply rule is ``verify.py``'s). The preparing step
reads the context it can while the workspace is made ready (:class:`Context`); a task
that resumes at its turn (a retry) has it read here.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

from sqlalchemy import Connection

from forgeflow.agent.port import CommentTool
from forgeflow.domain import prompt
from forgeflow.domain import publish as publish_rules
from forgeflow.domain.ids import ResourceRef, turn_key
from forgeflow.domain.markers import Marker, MarkerKind
from forgeflow.domain.paths import session_branch
from forgeflow.domain.records import Refs, Repository, Task
from forgeflow.domain.threads import thread_prompt
from forgeflow.gitea.client import GiteaClient, GiteaError
from forgeflow.store import Store, pushes, repos
from forgeflow.tasks.images import ConversationImages
from forgeflow.tasks.moves import TaskMoves
from forgeflow.tasks.threads import ReviewThreads
from forgeflow.workspace.manager import WorkspaceManager, WorktreeStatus

# The issue's title and its recent (author, body) comments.
Discussion = tuple[str | None, list[tuple[str, str]]]


@dataclass(frozen=True, slots=True)
class Conversation:
    """What was said: the issue's discussion for the prompt and its images (data URLs,
    tasks/images.py) for the turn's input."""

    discussion: Discussion
    images: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Context:
    """What the preparation read for the prompt in the same run: the worktree's status
    and the issue's conversation."""

    status: WorktreeStatus
    conversation: Conversation


@dataclass(frozen=True, slots=True)
class TurnPlan:
    """The turn about to start: its key, kind, answer marker and prompt."""

    key: str
    kind: str  # "normal", or "reply_retry": the agent only posts the answer it gave
    marker: str
    prompt: str
    images: tuple[str, ...] = ()  # the conversation's, as image input items


class Prompts:
    def __init__(
        self,
        store: Store,
        workspace: WorkspaceManager,
        gitea: GiteaClient,
        moves: TaskMoves,
        *,
        bot_login: str,
        threads: ReviewThreads | None = None,
        images: ConversationImages | None = None,
    ) -> None:
        self.threads = threads  # a mention in a review thread: the thread in the prompt
        self.images = images  # the conversation's attachments (None: no images)
        self.store = store
        self.workspace = workspace
        self.gitea = gitea
        self.moves = moves
        self.bot_login = bot_login

    async def plan(
        self,
        task: Task,
        resource: ResourceRef,
        cwd: str,
        tool: CommentTool,
        context: Context | None,
        *,
        answer_of: str | None,
        draft: bool,
        rebuilt: prompt.Rebuilt | None = None,
    ) -> TurnPlan:
        """The task's next turn. ``answer_of``: for a reply retry, the turn whose answer
        the agent is asked to post (its marker names that turn); None for a normal turn.
        ``context``: what the preparation read in this same run, else it is read now."""
        key = turn_key(task.task_id, int(task.turn_count) + 1)
        final = Marker(task.task_id, answer_of or key, task.resource_key, MarkerKind.FINAL)
        marker = final.render()
        if answer_of is not None:
            text = prompt.reply_retry_prompt(marker, tool.name, tool.arguments)
            return TurnPlan(key, "reply_retry", marker, text)
        waiting = dataclasses.replace(final, state="waiting_user").render()
        if context is None:
            status, conversation = await asyncio.gather(
                self.workspace.worktree_status(cwd), self.conversation(task, resource)
            )
            context = Context(status, conversation)
        text = await self._turn_prompt(
            task, resource, cwd, (marker, waiting), tool, context, draft, rebuilt
        )
        return TurnPlan(key, "normal", marker, text, context.conversation.images)

    async def _turn_prompt(
        self,
        task: Task,
        resource: ResourceRef,
        cwd: str,
        markers: tuple[str, str],
        tool: CommentTool,
        context: Context,
        draft: bool,
        rebuilt: prompt.Rebuilt | None = None,
    ) -> str:
        """The turn's prompt: the task, its workspace, its discussion and where its work
        goes."""
        refs = task.refs or Refs(None, None, None, None)
        title, discussion = context.conversation.discussion
        publishing, last_push, thread = "", None, None
        if not draft:
            publishing, last_push = await self._where_work_goes(task, resource)
            thread = await self._review_thread(task)
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
                base_ref=refs.base,
                head_ref=refs.head,
                upstream_moved=bool(refs.upstream_moved),
                uncommitted=context.status.modified + context.status.untracked,
                discussion=discussion,
                title=title,
                publishing=publishing,
                last_push=last_push,
                rebuilt=rebuilt,
                review_thread=thread,
            ),
            draft=draft,
        )

    async def _review_thread(self, task: Task) -> str | None:
        """The prompt's section on the review thread the mention was made in (its file,
        line, hunk and comments), or None; a Gitea failure costs only the section."""
        if self.threads is None:
            return None
        try:
            thread = await self.threads.locate(task)
        except GiteaError as exc:
            await self.moves.audit(task, "prompt.thread_unavailable", metadata={"error": str(exc)})
            return None
        return None if thread is None else thread_prompt(thread)

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

    async def conversation(self, task: Task, resource: ResourceRef) -> Conversation:
        """The issue's title and description and its recent comments, from Gitea, and
        the images attached to them (the mention's too).

        The bot's own comments and the comment that triggered this task are left out
        of the discussion (the latter is shown on its own); a Gitea failure only costs
        the context.
        """
        owner, name, number = resource.repo.owner, resource.repo.name, resource.number
        try:
            issue, comments = await asyncio.gather(
                self.gitea.issue(owner, name, number),
                self.gitea.list_comments(owner, name, number),
            )
        except GiteaError as exc:
            await self.moves.audit(
                task, "prompt.discussion_unavailable", metadata={"error": str(exc)}
            )
            return Conversation((None, []))
        images = () if self.images is None else await self.images.of(task, issue, comments)
        bot = self.bot_login.lower()
        thread = [(issue.user.login or "?", issue.body)]
        for c in comments:
            login = c.user.login or "?"
            if login.lower() == bot or c.id == task.comment_id:
                continue
            thread.append((login, c.body))
        recent = [(who, body[:4000]) for who, body in thread if body.strip()][-10:]
        return Conversation((issue.title or None, recent), images)
