"""Adapters of the pipeline ports onto forgeflow: tasks, Gitea, workspaces."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from pathlib import Path

from sqlalchemy import Connection

from forgeflow.agent.jail import JailRefused
from forgeflow.agent.oneshot import JailResult, JailRunner
from forgeflow.domain import modes
from forgeflow.domain.ids import INSTANCE_ID, InvalidName, RepoRef, ResourceKind, ResourceRef
from forgeflow.domain.json import JsonObject
from forgeflow.domain.paths import SESSIONS_DIR, repo_workspace
from forgeflow.domain.records import Task
from forgeflow.domain.states import SUCCEEDED_STATES, TERMINAL_STATES, TaskState
from forgeflow.gitea.client import GiteaClient, GiteaError, GiteaUnavailable
from forgeflow.pipelines.ports import (
    AgentRequest,
    AgentTaskStatus,
    ScriptOutput,
    ScriptRequest,
)
from forgeflow.pipelines.registry import StepFailed
from forgeflow.store import Store, sessions
from forgeflow.store import repos as repo_q
from forgeflow.store import tasks as task_q
from forgeflow.store import turns as turn_q
from forgeflow.workspace.manager import WorkspaceDirty, WorkspaceError, WorkspaceManager

PIPELINE_TASK_PREFIX = "pipeline-task-"
# What a script step may print (each stream); past it the jail is ended.
SCRIPT_OUTPUT_LIMIT = 1024 * 1024


def pipeline_task_id(key: str) -> str:
    return PIPELINE_TASK_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:24]


@dataclass(eq=False)  # a service object: equal only to itself
class StoreAgentDispatch:
    """AgentDispatchPort: agent work is an ordinary task in the tasks table, run by the
    scheduler like a mention; the task's last turn message is the final reply."""

    store: Store
    _: KW_ONLY
    workspace_root: str
    gitea: GiteaClient | None
    wake: Callable[[], None] | None = None

    async def create_space(self, resource: ResourceRef, mode: str, *, run_id: str) -> str:
        # chat is the mention workflow itself: the resource's own session and thread.
        # A draft mode gets a session of its own (per run and resource), whose thread
        # is started read-only without the Gitea MCP server: Codex has no per-turn way
        # to take a thread's MCP server (and the bot token in it) away again.
        if mode == modes.CHAT:
            row = await self.store.write(lambda c: sessions.ensure(c, resource))
            return row.session_key
        row = await self.store.write(
            lambda c: sessions.open_space(c, resource, mode=mode, run_id=run_id)
        )
        if row.mode != mode:
            raise StepFailed(
                "mode_mismatch",
                f"this run opened the space of {resource.key} in {row.mode} mode already",
                retryable=False,
            )
        return row.session_key

    async def _space(self, request: AgentRequest) -> tuple[str | None, str]:
        """The session and mode a step's task runs in (see ``domain.modes``)."""
        if request.space_id is None:
            # No space: the resource's own session, as a mention. Only a space can
            # make a step read-only, so asking for a draft mode here is an error.
            if request.mode not in (None, modes.CHAT):
                raise StepFailed(
                    "mode_needs_space",
                    f"extras.mode {request.mode} is read on messaging.createSpace: "
                    "open a space in that mode and pass its spaceId",
                    retryable=False,
                )
            return None, modes.CHAT
        space_id = request.space_id
        row = await self.store.read(lambda c: sessions.get(c, space_id))
        if row is None or row.resource_key != request.resource.key:
            raise StepFailed(
                "space_mismatch",
                f"space {space_id} is not a conversation of {request.resource.key}",
                retryable=False,
            )
        space_mode = row.mode or modes.CHAT
        refused = modes.step_mode_error(space_mode, request.mode)
        if refused is not None:
            raise StepFailed(refused[0], refused[1], retryable=False)
        return row.session_key, space_mode

    async def _repo_facts(self, repo: RepoRef) -> dict[str, str | None]:
        known = await self.store.read(lambda c: repo_q.get(c, repo.key))
        if known is not None:
            return {"clone_url": None, "default_branch": None, "workspace_path": None}
        if self.gitea is None:
            raise StepFailed(
                "not_configured",
                f"repository {repo.full_name} is unknown and FORGEFLOW_GITEA_URL is not set",
                retryable=False,
            )
        try:
            found = await self.gitea.repository(repo.owner, repo.name)
        except GiteaError as exc:
            raise gitea_step_failed(exc) from None
        return {
            "clone_url": found.clone_url,
            "default_branch": found.default_branch or "main",
            "workspace_path": repo_workspace(self.workspace_root, repo),
        }

    async def dispatch(self, request: AgentRequest) -> str:
        task_id = pipeline_task_id(request.key)
        session_key, mode = await self._space(request)
        facts = await self._repo_facts(request.resource.repo)

        def _create(conn: Connection) -> Task:
            return task_q.create_pipeline_task(
                conn,
                task_id=task_id,
                resource=request.resource,
                instruction=request.prompt,
                run_id=request.run_id,
                session_key=session_key,
                mode=mode,
                **facts,
            )

        try:
            await self.store.write(_create)
        except task_q.RepositoryDisabled as exc:
            raise StepFailed(exc.code, str(exc), retryable=False) from None
        if self.wake is not None:
            self.wake()
        return task_id

    async def poll(self, task_id: str) -> AgentTaskStatus:
        def _read(conn: Connection) -> AgentTaskStatus | None:
            task = task_q.get(conn, task_id)
            if task is None:
                return None
            turn = turn_q.last_normal(conn, task_id)
            return AgentTaskStatus(
                task_id=task_id,
                state=task.state,
                terminal=TaskState(task.state) in TERMINAL_STATES,
                succeeded=task.state in SUCCEEDED_STATES,
                reply=turn.last_message if turn else None,
                error=task.execution_error or task.reply_error or task.error_code,
                input_tokens=task.input_tokens,
                output_tokens=task.output_tokens,
            )

        status = await self.store.read(_read)
        if status is None:
            raise StepFailed("task_missing", f"task {task_id} does not exist", retryable=False)
        return status


# The names of Gitea's 4xx answers a step reports; a step may not be retried on them
# (the same request gets the same answer), where an unreachable Gitea or a 5xx may be.
_REFUSALS = {
    400: "gitea_bad_request",
    401: "gitea_unauthorized",
    403: "gitea_forbidden",
    404: "gitea_not_found",
    409: "gitea_conflict",
    422: "gitea_unprocessable",
}
LABEL_COLOR = "#b60205"  # what a label forgeflow creates looks like in Gitea


def gitea_step_failed(exc: GiteaError) -> StepFailed:
    """A Gitea error as a step's failure, with a code that says what Gitea said."""
    if isinstance(exc, GiteaUnavailable) or exc.status is None or exc.status >= 500:
        return StepFailed("gitea_unavailable", str(exc))
    if exc.status == 429:
        return StepFailed("gitea_rate_limited", str(exc))
    code = _REFUSALS.get(exc.status, f"gitea_http_{exc.status}")
    return StepFailed(code, str(exc), retryable=False)


class GiteaAdapter:
    """GiteaPort on the bot's REST client."""

    def __init__(self, client: GiteaClient, bot_login: str) -> None:
        self.client = client
        self.bot = bot_login.lower()

    async def comment(self, repo: RepoRef, number: int, body: str, *, marker: str) -> int:
        try:
            for c in await self.client.list_comments(repo.owner, repo.name, number):
                # The bot's own comment, ending with the marker: anyone (an agent too)
                # can quote the marker, and that must not pass for the step's post.
                if c.user.login.lower() == self.bot and c.body.rstrip().endswith(marker):
                    return c.id
            made = await self.client.create_comment(
                repo.owner, repo.name, number, f"{body}\n\n{marker}"
            )
        except GiteaError as exc:
            raise gitea_step_failed(exc) from None
        return made.id

    async def add_labels(
        self, repo: RepoRef, number: int, labels: list[str], *, create_missing: bool = False
    ) -> list[str]:
        """Add labels by name. Gitea refuses a name the repository lacks (404 or 422,
        depending on its version) or leaves it out of its answer: the missing ones are
        then created first when asked, else the step names them."""
        refused: GiteaError | None = None
        try:
            names = await self._add(repo, number, labels)
        except GiteaError as exc:
            if exc.status not in (404, 422):
                raise gitea_step_failed(exc) from None
            refused, names = exc, []
        if refused is None and {n.lower() for n in labels} <= {n.lower() for n in names}:
            return names
        if not await self._missing_labels(repo, labels, create=create_missing):
            if refused is not None:  # every label exists: the issue is what Gitea lacks
                raise gitea_step_failed(refused) from None
            return names
        try:
            return await self._add(repo, number, labels)
        except GiteaError as exc:
            raise gitea_step_failed(exc) from None

    async def _add(self, repo: RepoRef, number: int, labels: list[str]) -> list[str]:
        result = await self.client.add_labels(repo.owner, repo.name, number, labels)
        return [label.name for label in result]

    async def _missing_labels(self, repo: RepoRef, labels: list[str], *, create: bool) -> list[str]:
        """The labels the repository lacks, created when ``create``; else the step fails
        naming them."""
        try:
            have = {label.name.lower() for label in await self.client.labels(repo.owner, repo.name)}
            missing = [name for name in labels if name.lower() not in have]
            if missing and not create:
                raise StepFailed(
                    "label_missing",
                    f"{repo.full_name} has no label {', '.join(missing)}: create it in Gitea "
                    "(Issues → Labels), or give the step createMissing: true",
                    retryable=False,
                )
            for name in missing:
                await self.client.create_label(
                    repo.owner,
                    repo.name,
                    name,
                    color=LABEL_COLOR,
                    description="created by forgeflow for a pipeline step",
                )
        except GiteaError as exc:
            raise gitea_step_failed(exc) from None
        return missing

    async def is_closed(self, repo: RepoRef, number: int) -> bool:
        try:
            issue = await self.client.issue(repo.owner, repo.name, number)
        except GiteaError as exc:
            if exc.status == 404:
                return True  # deleted (or the repository is gone): nothing to keep it for
            raise gitea_step_failed(exc) from None
        return issue.state == "closed"


def _script_output(done: JailResult) -> ScriptOutput:
    if done.timed_out:
        raise TimeoutError
    if done.truncated:
        raise StepFailed(
            "script_output_limit",
            f"the script printed more than {SCRIPT_OUTPUT_LIMIT} bytes and was ended",
            retryable=False,
        )
    return ScriptOutput(done.returncode, done.stdout, done.stderr)


class LocalWorkspace:
    """WorkspacePort on this process's workspace root."""

    def __init__(
        self,
        workspace_root: str,
        scratch_root: str,
        manager: WorkspaceManager | None = None,
        *,
        jail_runner: JailRunner,
        store: Store | None = None,
    ) -> None:
        self.workspace_root = workspace_root
        self.scratch_root = scratch_root
        self.manager = manager
        self.jail_runner = jail_runner
        self.store = store  # where a step's spaceId is looked up

    async def run_script(self, request: ScriptRequest) -> ScriptOutput:
        """The repository's jail when its clone exists (read-only for a draft space),
        else a jail around the run's own scratch folder (agent.oneshot)."""
        read_only = await self._draft_space(request)
        clone = self._clone(request.repo)
        try:
            if clone is not None and request.repo is not None:
                done = await self.jail_runner.run(
                    request.argv,
                    repository=request.repo,
                    cwd=str(clone),
                    read_only=read_only,
                    env=request.env,
                    timeout=request.timeout,
                    output_limit=SCRIPT_OUTPUT_LIMIT,
                )
            else:
                done = await self.jail_runner.run_scratch(
                    request.argv,
                    scratch=Path(self.scratch_root) / request.run_id,
                    env=request.env,
                    timeout=request.timeout,
                    output_limit=SCRIPT_OUTPUT_LIMIT,
                )
        except JailRefused as exc:
            raise StepFailed(exc.code, str(exc), retryable=False) from None
        except OSError as exc:  # E2BIG: the script or a value too long for an argv
            raise StepFailed(
                "invalid_input", f"the script did not start: {exc}", retryable=False
            ) from None
        return _script_output(done)

    def _clone(self, repo: RepoRef | None) -> Path | None:
        if repo is None:
            return None
        path = Path(repo_workspace(self.workspace_root, repo))
        return path if path.is_dir() and not path.is_symlink() else None

    async def _draft_space(self, request: ScriptRequest) -> bool:
        """Whether the step's space (``extras.spaceId``) is a draft (read-only) space;
        a space of another repository, or none at all, is refused."""
        if request.space_id is None:
            return False
        space_id = request.space_id
        row = None
        if self.store is not None:
            row = await self.store.read(lambda c: sessions.get(c, space_id))
        if row is None or request.repo is None or row.repo_key != request.repo.key:
            raise StepFailed(
                "space_mismatch",
                f"space {space_id} is not a conversation of inputs.repo",
                retryable=False,
            )
        return modes.is_draft(row.mode)

    def session_resources(self) -> list[ResourceRef]:
        # <root>/.sessions/default/<owner>/<repo>/<kind>-<n>: the layout of
        # domain.paths.session_worktree; anything else in there is not ours.
        base = Path(self.workspace_root) / SESSIONS_DIR / INSTANCE_ID
        found = []
        for leaf in sorted(base.glob("*/*/*")):
            kind, _, number = leaf.name.rpartition("-")
            try:
                repo = RepoRef(leaf.parent.parent.name, leaf.parent.name)
                found.append(ResourceRef(repo, ResourceKind(kind), int(number)))
            except (InvalidName, ValueError):
                continue
        return found

    async def cleanup(self, resource: ResourceRef) -> JsonObject:
        if self.manager is None:
            raise StepFailed("not_configured", "no workspace manager here", retryable=False)
        try:
            removed = await self.manager.remove_session(resource)
        except WorkspaceDirty as exc:
            raise StepFailed(exc.code, str(exc), retryable=False) from None
        except WorkspaceError as exc:
            raise StepFailed(exc.code, str(exc)) from None
        return {"resourceKey": resource.key, "removed": removed}
