"""The ``AgentRuntime`` port: what the task pipeline needs from a coding agent.

The Codex app-server adapter implements it; the pipeline never sees JSON-RPC.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from forgeflow.domain.json import JsonObject
from forgeflow.domain.rollout import NotKept, Rollout
from forgeflow.domain.transcript import Entry


class AgentError(Exception):
    """A runtime failure with a stable code, kept in the task's audit and error, e.g.
    ``app_server_timeout``; ``retryable`` says whether the task may be tried again."""

    def __init__(self, code: str, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable


@dataclass(frozen=True, slots=True)
class CommentTool:
    """The MCP tool the agent posts its answer with, as the prompt names it."""

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """Everything a thread is started or resumed with.

    ``read_only``: a draft space's thread (review/plan mode): read-only sandbox and no
    Gitea MCP server, so neither the agent's shell nor a tool can write anywhere."""

    session_key: str
    thread_id: str | None
    cwd: str
    owner: str
    repo: str
    developer_instructions: str
    read_only: bool = False
    # The thread as another worker kept it (issue #27): read only when the app-server
    # does not know ``thread_id``, to restore it before resuming.
    kept: Callable[[], Awaitable[Rollout | NotKept]] | None = None
    # A pull request review task (read_only too): its Gitea tools are the readers and
    # submit_review, on a thread of its own.
    review: bool = False


@dataclass(frozen=True, slots=True)
class TurnSpec:
    task_id: str
    turn_key: str
    prompt: str
    kind: str = "normal"  # or "reply_retry"
    marker: str = ""  # the exact line the final comment must end with
    owner: str = ""
    repo: str = ""
    number: int = 0
    # A draft turn (review/plan mode): read-only sandbox for this turn, nothing posted;
    # its answer is the turn's last agent message.
    read_only: bool = False
    model: str | None = None  # the task's own model (a mention's ``--model``)
    # The conversation's images as data URLs (tasks/images.py), image input items.
    images: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TurnHandle:
    thread_id: str
    turn_id: str


class TurnStatus(StrEnum):
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """An MCP tool call the agent made, secrets already removed from ``arguments``."""

    seq: int
    tool: str
    arguments: JsonObject
    ok: bool
    comment_id: int | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class TokenUsage:
    """The turn's running totals; ``cached_input_tokens`` is a part of the input."""

    seq: int
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int = 0


@dataclass(frozen=True, slots=True)
class NeedsUser:
    """The agent asked the user something (``item/tool/requestUserInput``)."""

    seq: int
    question: str


@dataclass(frozen=True, slots=True)
class TurnCompleted:
    seq: int
    status: TurnStatus
    error_code: str | None = None
    error: str | None = None
    last_message: str | None = None


@dataclass(frozen=True, slots=True)
class Notice:
    """Anything else worth an audit line (approval declined, downgrade, …)."""

    seq: int
    action: str
    metadata: JsonObject = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Transcribed:
    """One finished item of the turn for its transcript (already bounded and redacted)."""

    seq: int
    item_id: str
    entry: Entry


@dataclass(frozen=True, slots=True)
class Progress:
    """The agent's plan (``turn/plan/updated``: steps with their status) or what it
    does now (``item/started``, one line): shown on the receipt, not recorded."""

    seq: int
    plan: tuple[tuple[str, str], ...] | None = None
    doing: str | None = None


AgentEvent = ToolCall | TokenUsage | NeedsUser | TurnCompleted | Notice | Transcribed | Progress


class AgentRuntime(Protocol):
    async def comment_tool(self) -> CommentTool:
        """The comment tool of the Gitea MCP server (after its preflight)."""

    async def ensure_session(self, spec: SessionSpec) -> str:
        """Resume ``spec.thread_id`` or start a thread; return the thread id."""

    async def start_turn(self, thread_id: str, turn: TurnSpec) -> TurnHandle: ...

    def events(self, handle: TurnHandle) -> AsyncIterator[AgentEvent]:
        """The turn's events in order, ending with one :class:`TurnCompleted`."""

    async def interrupt(self, handle: TurnHandle) -> None: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class ThreadArchive(Protocol):
    """A runtime whose threads can be kept outside its worker (the Codex one)."""

    async def export_thread(self, owner: str, repo: str, thread_id: str) -> Rollout | NotKept:
        """The thread's state as its app-server left it, bounded and redacted."""
