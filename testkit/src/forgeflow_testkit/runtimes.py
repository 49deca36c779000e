"""A scripted :class:`AgentRuntime` for scheduler tests and benchmarks.

It does what the scheduler needs to be measured against — a turn that takes a known
time and answers through Gitea — without a model. The answer is a real comment posted
to the Gitea (emulator) REST API with the bot's token, as the agent's MCP tool would.
Behaviour comes from the environment because ``forgeflow serve`` builds it from
``FORGEFLOW_AGENT_RUNTIME=forgeflow_testkit.runtimes:scripted_runtime``:

- ``FORGEFLOW_TEST_TURN_SECONDS``: how long a turn takes (default 0.2); a range such as
  ``0.05-0.5`` gives each task its own length in that range, the same for every turn of
  the task and in every process (derived from the task id);
- ``FORGEFLOW_TEST_REPLY``: ``mcp`` (post the final comment), ``none`` (forget to);
  ``none-once`` forgets only the first turn of a task; ``ask`` asks the user a
  question instead of answering (``item/tool/requestUserInput``); ``early`` posts the
  answer at the start of the turn, before it ends; a draft turn (``TurnSpec.read_only``,
  a review/plan pipeline space) never posts and answers with :func:`draft_text`;
- ``FORGEFLOW_TEST_TRACE``: a JSON-lines file receiving turn start/end times.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from forgeflow.agent.port import (
    AgentEvent,
    CommentTool,
    NeedsUser,
    SessionSpec,
    TokenUsage,
    ToolCall,
    TurnCompleted,
    TurnHandle,
    TurnSpec,
    TurnStatus,
)
from forgeflow.config import Settings
from forgeflow.gitea.client import GiteaClient, GiteaError


class ScriptedRuntime:
    def __init__(
        self,
        gitea_url: str,
        token: str,
        *,
        turn_seconds: float = 0.2,
        reply: str = "mcp",
        trace: str | None = None,
        turn_range: tuple[float, float] | None = None,
    ) -> None:
        # The bot's Gitea client, as gitea-mcp posts in production (another process
        # there, so this one should cost the serve process as little as forgeflow's own).
        self._gitea = GiteaClient(gitea_url, token, timeout=30)
        self.turn_seconds = turn_seconds
        self.turn_range = turn_range
        self.reply = reply
        self.trace = trace
        self._threads: dict[str, str] = {}
        self._turns: dict[str, tuple[TurnSpec, asyncio.Event]] = {}
        self._forgot: set[str] = set()

    async def comment_tool(self) -> CommentTool:
        return CommentTool("add_comment", "owner, repo, issue_number, body")

    async def ensure_session(self, spec: SessionSpec) -> str:
        if spec.thread_id:
            return spec.thread_id
        thread = f"thread-{uuid.uuid4().hex[:12]}"
        self._threads[spec.session_key] = thread
        return thread

    async def start_turn(self, thread_id: str, turn: TurnSpec) -> TurnHandle:
        handle = TurnHandle(thread_id, f"turn-{uuid.uuid4().hex[:12]}")
        self._turns[handle.turn_id] = (turn, asyncio.Event())
        return handle

    def seconds_for(self, task_id: str) -> float:
        """The turn length of ``task_id``: fixed, or a point of ``turn_range`` that only
        depends on the task id."""
        if self.turn_range is None:
            return self.turn_seconds
        low, high = self.turn_range
        digest = hashlib.sha256(task_id.encode()).digest()
        return low + (high - low) * int.from_bytes(digest[:8], "big") / 2**64

    def _trace(self, **record: Any) -> None:
        if self.trace:
            with open(self.trace, "a") as fh:
                fh.write(json.dumps({"t": time.time(), "pid": os.getpid(), **record}) + "\n")

    async def events(self, handle: TurnHandle) -> AsyncIterator[AgentEvent]:
        turn, interrupted = self._turns[handle.turn_id]
        repo_key = turn.task_id and f"{turn.owner}/{turn.repo}"
        self._trace(event="start", task=turn.task_id, repo=repo_key, turn=turn.turn_key)
        if self.reply == "early":
            # Answer first, then keep working: a crash now leaves an answer on Gitea
            # that forgeflow has not recorded yet.
            await self._post_final(turn)
            self._trace(event="posted", task=turn.task_id, repo=repo_key, turn=turn.turn_key)
        try:
            async with asyncio.timeout(self.seconds_for(turn.task_id)):
                await interrupted.wait()
        except TimeoutError:
            pass
        if interrupted.is_set():
            self._trace(event="interrupted", task=turn.task_id, repo=repo_key, turn=turn.turn_key)
            yield TurnCompleted(1, TurnStatus.INTERRUPTED, error="interrupted")
            return
        seq = 1
        yield TokenUsage(seq, input_tokens=100, output_tokens=20)
        if turn.read_only:
            # A draft turn (review/plan space) has no Gitea tool: it answers in its
            # final message only, whatever FORGEFLOW_TEST_REPLY says.
            self._trace(event="end", task=turn.task_id, repo=repo_key, turn=turn.turn_key)
            yield TurnCompleted(seq + 1, TurnStatus.COMPLETED, last_message=draft_text(turn))
            return
        if self.reply == "ask":
            yield NeedsUser(seq + 1, "Which branch should I use?")
            self._trace(event="end", task=turn.task_id, repo=repo_key, turn=turn.turn_key)
            yield TurnCompleted(seq + 2, TurnStatus.COMPLETED)
            return
        if self._should_reply(turn):
            seq += 1
            comment_id = await self._post_final(turn)
            yield ToolCall(
                seq,
                "add_comment",
                {"owner": turn.owner, "repo": turn.repo, "issue_number": turn.number},
                ok=comment_id is not None,
                comment_id=comment_id,
            )
        self._trace(event="end", task=turn.task_id, repo=repo_key, turn=turn.turn_key)
        yield TurnCompleted(seq + 1, TurnStatus.COMPLETED, last_message=f"done: {turn.task_id}")

    async def _post_final(self, turn: TurnSpec) -> int | None:
        """The final comment's id, or None when Gitea refused it."""
        body = f"done: {turn.task_id}\n\n{turn.marker}"
        try:
            created = await self._gitea.create_comment(turn.owner, turn.repo, turn.number, body)
        except GiteaError:
            return None
        return created.id

    def _should_reply(self, turn: TurnSpec) -> bool:
        if self.reply == "early":
            return False  # already posted at the start of the turn
        if self.reply == "none":
            return False
        if self.reply == "none-once" and turn.task_id not in self._forgot:
            self._forgot.add(turn.task_id)
            return False
        return True

    async def interrupt(self, handle: TurnHandle) -> None:
        self._turns[handle.turn_id][1].set()

    async def aclose(self) -> None:
        await self._gitea.aclose()


def draft_text(turn: TurnSpec) -> str:
    """The final message of a scripted draft turn."""
    return (
        f"comment: draft review of {turn.owner}/{turn.repo}#{turn.number} "
        f"({turn.task_id}); no finding."
    )


def parse_turn_seconds(text: str) -> tuple[float, tuple[float, float] | None]:
    """``"0.3"`` → (0.3, None); ``"0.05-0.5"`` → (0.5, (0.05, 0.5))."""
    low, sep, high = text.strip().partition("-")
    if not sep:
        return float(low), None
    bounds = (float(low), float(high))
    if not 0 <= bounds[0] <= bounds[1]:
        raise ValueError(f"FORGEFLOW_TEST_TURN_SECONDS: bad range {text!r}")
    return bounds[1], bounds


def scripted_runtime(settings: Settings) -> ScriptedRuntime:
    assert settings.gitea_url is not None and settings.gitea_token is not None
    seconds, spread = parse_turn_seconds(os.environ.get("FORGEFLOW_TEST_TURN_SECONDS", "0.2"))
    return ScriptedRuntime(
        settings.gitea_url,
        settings.gitea_token.get_secret_value(),
        turn_seconds=seconds,
        turn_range=spread,
        reply=os.environ.get("FORGEFLOW_TEST_REPLY", "mcp"),
        trace=os.environ.get("FORGEFLOW_TEST_TRACE"),
    )
