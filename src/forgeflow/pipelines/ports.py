"""Ports: what pipeline bodies need from the rest of forgeflow, as Protocols.

The engine knows nothing of tasks, Gitea or workspaces; bodies registered in the
:class:`~forgeflow.pipelines.registry.PipelineBodyRegistry` hold these ports. Adapters live in
:mod:`forgeflow.pipelines.adapters`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from forgeflow.domain.ids import RepoRef, ResourceRef
from forgeflow.domain.json import JsonObject
from forgeflow.domain.review_asks import ReviewAsk, ReviewAsked, ReviewProgress


@dataclass(frozen=True, slots=True)
class AgentRequest:
    """One agent task for a resource; ``key`` makes creating it idempotent."""

    key: str
    run_id: str
    resource: ResourceRef
    prompt: str
    space_id: str | None = None
    mode: str | None = None


@dataclass(frozen=True, slots=True)
class ScriptRequest:
    """One ``pipeline.bashScript`` command: where (the repository, or none: the run's
    scratch folder; a draft space makes it read-only) and with what (``env`` is all of
    its input)."""

    run_id: str
    repo: RepoRef | None
    space_id: str | None
    argv: tuple[str, ...]
    env: Mapping[str, str]
    timeout: float


@dataclass(frozen=True, slots=True)
class ScriptOutput:
    code: int
    stdout: bytes  # the last bytes only (bounded)
    stderr: bytes


@dataclass(frozen=True, slots=True)
class AgentTaskStatus:
    task_id: str
    state: str
    terminal: bool
    succeeded: bool
    reply: str | None = None
    error: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0


class AgentDispatchPort(Protocol):
    async def create_space(self, resource: ResourceRef, mode: str, *, run_id: str) -> str:
        """Open (or reuse) the conversation of a resource in ``mode`` for ``run_id``;
        returns its spaceId. Raises ``StepFailed`` when the run already opened one
        in another mode."""
        ...

    async def dispatch(self, request: AgentRequest) -> str:
        """Create the agent task (once per ``request.key``) in its space's mode; returns
        its task id. Raises ``StepFailed`` when the step's mode differs from its
        space's (``mode_widening``, ``mode_mismatch``)."""
        ...

    async def poll(self, task_id: str) -> AgentTaskStatus:
        """Whether the task is terminal, and its final reply text when it is."""
        ...


class GiteaPort(Protocol):
    async def comment(self, repo: RepoRef, number: int, body: str, *, marker: str) -> int:
        """Post a comment once: a comment already carrying ``marker`` is not re-posted.
        Returns the comment id."""
        ...

    async def add_labels(
        self, repo: RepoRef, number: int, labels: list[str], *, create_missing: bool = False
    ) -> list[str]:
        """Add labels (by name) to an issue or pull request; returns its labels.
        ``create_missing``: create the labels the repository does not have yet."""
        ...

    async def is_closed(self, repo: RepoRef, number: int) -> bool:
        """Whether the issue or pull request is closed (merged pull requests are)."""
        ...


class ReviewPort(Protocol):
    """Pull request reviews as review tasks (``tasks/review_asks.py``)."""

    async def ask(self, ask: ReviewAsk) -> ReviewAsked:
        """The review task of a step execution: admitted once per ``ask.key`` as the
        review command is (the permission rule applied to who started the run), or an
        earlier attempt's still running or succeeded. Raises ``GiteaError`` when the
        pull request cannot be read."""
        ...

    async def progress(self, task_id: str) -> ReviewProgress | None:
        """The review task's state and, once posted, its Gitea review (None: no task)."""
        ...


class WorkspacePort(Protocol):
    async def run_script(self, request: ScriptRequest) -> ScriptOutput:
        """Run a ``pipeline.bashScript`` command in the repository's jail (read-only for
        a draft space), else in a jail around the run's own scratch folder. Raises
        ``TimeoutError`` once it was killed at its time limit, ``StepFailed`` when the
        space or repository does not fit."""
        ...

    async def cleanup(self, resource: ResourceRef) -> JsonObject:
        """Remove the clean session worktree of a closed issue or merged pull request."""
        ...

    def session_resources(self) -> list[ResourceRef]:
        """The issues and pull requests that have a session worktree on this host."""
        ...


@dataclass(frozen=True, slots=True)
class ChildRun:
    run_id: str
    status: str
    state: JsonObject
    error: str | None = None


class RunsPort(Protocol):
    """Pipelines starting pipelines (``flow.callPipeline``)."""

    async def start_child(
        self,
        template_key: str,
        *,
        parent_run_id: str,
        parent_step_id: str,
        parent_item_index: int,
        inputs: JsonObject,
        dedupe_key: str,
    ) -> str: ...

    async def child(self, run_id: str) -> ChildRun: ...


@dataclass(frozen=True)
class Ports:
    runs: RunsPort
    workspace: WorkspacePort
    agent: AgentDispatchPort | None = None
    gitea: GiteaPort | None = None
    reviews: ReviewPort | None = None
