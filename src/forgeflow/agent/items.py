"""What a turn's notifications and an app-server's requests mean for forgeflow: the
per-turn state, the items worth recording, and the answers to the agent's questions."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from forgeflow.agent.jsonrpc import Json, RpcProcess
from forgeflow.agent.port import (
    AgentEvent,
    NeedsUser,
    Notice,
    Progress,
    TokenUsage,
    ToolCall,
    Transcribed,
    TurnCompleted,
    TurnHandle,
    TurnStatus,
)
from forgeflow.domain import transcript
from forgeflow.domain.json import JsonObject
from forgeflow.domain.tracking import doing_line, plan_steps
from forgeflow.redaction import redact

if TYPE_CHECKING:
    from forgeflow.agent.appserver import AppServer


@dataclass(eq=False)
class TurnState:
    handle: TurnHandle
    server: AppServer
    queue: asyncio.Queue[AgentEvent] = field(default_factory=asyncio.Queue)
    seq: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    usage_at_start: tuple[int, int] = (0, 0)
    last_message: str | None = None
    error: str | None = None
    done: bool = False

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def put(self, event: AgentEvent) -> None:
        self.queue.put_nowait(event)

    def finish(self, status: TurnStatus, **kw: Any) -> bool:
        """End the turn once (False if it already ended): the pass-through's count of
        its model use, then its completion."""
        if self.done:
            return False
        self.done = True
        usage = self.server.model.usage
        before_in, before_out = self.usage_at_start
        metadata: JsonObject = {
            "inputTokens": usage.input_tokens - before_in,
            "outputTokens": usage.output_tokens - before_out,
        }
        self.put(Notice(self.next_seq(), "model.usage", metadata))
        self.put(TurnCompleted(self.next_seq(), status, last_message=self.last_message, **kw))
        return True


TurnEnd = tuple[TurnStatus, str | None, str | None]  # status, error code, error text


def on_notification(turn: TurnState, method: str, params: Json) -> TurnEnd | None:
    """Record one notification of a turn; how it ended, for ``turn/completed``."""
    if method == "item/completed":
        on_item(turn, params.get("item") or {})
    elif method == "thread/tokenUsage/updated":
        last = (params.get("tokenUsage") or {}).get("last") or {}
        turn.input_tokens += int(last.get("inputTokens") or 0)
        turn.output_tokens += int(last.get("outputTokens") or 0)
        turn.cached_input_tokens += int(last.get("cachedInputTokens") or 0)
        turn.put(
            TokenUsage(
                turn.next_seq(), turn.input_tokens, turn.output_tokens, turn.cached_input_tokens
            )
        )
    elif method in ("turn/plan/updated", "item/started"):
        progress = _progress(turn.next_seq(), method, params)
        if progress is not None:
            turn.put(progress)
    elif method == "error":
        turn.error = str((params.get("error") or {}).get("message") or params)[:2000]
    elif method == "turn/completed":
        body = params.get("turn") or {}
        error = body.get("error") or {}
        status = {"completed": TurnStatus.COMPLETED, "interrupted": TurnStatus.INTERRUPTED}.get(
            str(body.get("status")), TurnStatus.FAILED
        )
        code = {TurnStatus.COMPLETED: None, TurnStatus.INTERRUPTED: "interrupted"}.get(
            status, "model_error"
        )
        return status, code, str(error.get("message") or turn.error or "") or None
    return None


def _progress(seq: int, method: str, params: Json) -> Progress | None:
    """The receipt's view of a plan update or a started item (bounded in tracking.py)."""
    if method == "turn/plan/updated":
        return Progress(seq, plan=plan_steps(params.get("plan")))
    doing = doing_line(params.get("item"))
    return Progress(seq, doing=doing) if doing else None


def on_item(turn: TurnState, item: Json) -> None:
    kind = item.get("type")
    entry = transcript.from_item(item, redact)
    if entry is not None:
        turn.put(Transcribed(turn.next_seq(), str(item.get("id") or turn.seq), entry))
    if kind == "agentMessage":
        turn.last_message = str(item.get("text") or "") or turn.last_message
    elif kind == "mcpToolCall":
        comment_id = None
        result = item.get("result") or {}
        for part in result.get("content") or []:
            # A JSON answer without an id (any tool but a comment's) binds nothing.
            with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError):
                comment_id = int(json.loads(part.get("text", ""))["id"])
                break
        error = item.get("error") or {}
        turn.put(
            ToolCall(
                turn.next_seq(),
                f"{item.get('server')}.{item.get('tool')}",
                redact(item.get("arguments") or {}),
                ok=item.get("status") == "completed" and not result.get("isError"),
                comment_id=comment_id,
                error=str(error.get("message")) if error else None,
            )
        )


async def on_server_request(
    proc: RpcProcess,
    turns: dict[str, TurnState],
    request_id: Any,
    method: str,
    params: Json,
    elicitation_policy: str,
) -> None:
    turn = turns.get(str(params.get("turnId")))
    if method == "item/tool/requestUserInput":
        questions = params.get("questions") or []
        text = "\n".join(str(q.get("question") or "") for q in questions if isinstance(q, dict))
        if turn is not None:
            turn.put(NeedsUser(turn.next_seq(), text or "(question)"))
        answers = {
            str(q.get("id")): {"answers": ["The user will answer in a later comment."]}
            for q in questions
            if isinstance(q, dict)
        }
        await proc.respond(request_id, {"answers": answers})
        return
    if method == "mcpServer/elicitation/request":
        action = "accept" if elicitation_policy == "accept" else "decline"
        if turn is not None:
            turn.put(
                Notice(
                    turn.next_seq(),
                    "agent.elicitation",
                    {
                        "server": params.get("serverName"),
                        "message": str(params.get("message"))[:500],
                        "answer": action,
                    },
                )
            )
        await proc.respond(request_id, {"action": action, "content": None})
        return
    # Nothing should ask for approval with approvalPolicy never; anything that does is
    # declined and reported.
    if turn is not None:
        turn.put(Notice(turn.next_seq(), "agent.approval_declined", {"method": method}))
    await proc.respond(request_id, {"decision": "decline"})
