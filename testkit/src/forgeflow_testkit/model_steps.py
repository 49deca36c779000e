"""What the scripted model can answer with: the steps of a turn script, and the Responses-API
items and SSE events they become. See model_server.py for the server that plays them."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

JsonObject = dict[str, Any]

# Codex names its MCP tools `mcp__<server>__<tool>` in older releases and sends them as a
# namespace tool `mcp__<server>` holding plain `<tool>` functions in 0.171.0.
MCP_PREFIX = "mcp__"

_ids = itertools.count(1)


def new_id(prefix: str) -> str:
    """Ids shaped like OpenAI's (`msg_…`, `fc_…`, `call_…`, `resp_…`), unique per process."""
    return f"{prefix}_scripted{next(_ids):06d}"


@dataclass(frozen=True)
class ToolRef:
    """A function tool as codex offered it in a request: `namespace` is the enclosing
    namespace tool's name (e.g. `mcp__gitea`), or None for a top-level function."""

    name: str
    namespace: str | None
    parameters: JsonObject

    @property
    def qualified(self) -> str:
        return f"{self.namespace}__{self.name}" if self.namespace else self.name


def offered_tools(tools: Sequence[Any]) -> list[ToolRef]:
    """Flattens the request's `tools` list (functions and namespaces of functions)."""
    found: list[ToolRef] = []
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        if tool.get("type") == "function":
            found.append(ToolRef(str(tool.get("name")), None, tool.get("parameters") or {}))
        elif tool.get("type") == "namespace":
            for inner in tool.get("tools") or []:
                if isinstance(inner, dict) and inner.get("type") == "function":
                    found.append(
                        ToolRef(
                            str(inner["name"]), str(tool["name"]), inner.get("parameters") or {}
                        )
                    )
    return found


def match_tool(tools: Sequence[ToolRef], wanted: str, namespace: str | None) -> ToolRef | None:
    """`wanted` may be a bare name (`add_comment`) or qualified (`mcp__gitea__add_comment`);
    `namespace`, when given, must match too."""
    for tool in tools:
        if namespace is not None and tool.namespace != namespace:
            continue
        if wanted in (tool.name, tool.qualified) or (
            tool.namespace is None
            and tool.name.startswith(MCP_PREFIX)
            and tool.name.endswith(f"__{wanted}")
        ):
            return tool
    return None


class ScriptError(Exception):
    """The script cannot answer this request (e.g. the tool it names was not offered);
    the server answers 500 with this message and records it."""


@dataclass(frozen=True)
class Usage:
    """The `usage` object of `response.completed`: codex turns it into
    `thread/tokenUsage/updated` (inputTokens, cachedInputTokens, outputTokens, …)."""

    input_tokens: int = 100
    cached_input_tokens: int = 0
    output_tokens: int = 10
    reasoning_output_tokens: int = 0

    def to_json(self) -> JsonObject:
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_input_tokens},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_output_tokens},
            "total_tokens": self.input_tokens + self.output_tokens,
        }


@dataclass(frozen=True)
class Message:
    """An assistant message: codex shows it as an `agentMessage` item."""

    text: str


Arguments = Mapping[str, Any] | Callable[[ToolRef], Mapping[str, Any]]


@dataclass(frozen=True)
class ToolCall:
    """A `function_call` to a tool codex offered. `tool` is a name or a list of candidate
    names (first offered one wins, e.g. `["add_comment", "issue_write"]` covers both Gitea
    MCP servers); `arguments` may be a function of the chosen tool."""

    tool: str | Sequence[str]
    arguments: Arguments = field(default_factory=dict)
    namespace: str | None = None
    call_id: str | None = None

    def resolve(self, tools: Sequence[ToolRef]) -> ToolRef:
        names = [self.tool] if isinstance(self.tool, str) else list(self.tool)
        for name in names:
            found = match_tool(tools, name, self.namespace)
            if found is not None:
                return found
        offered = ", ".join(t.qualified for t in tools)
        raise ScriptError(f"tool {names} not offered by codex; offered: {offered}")


@dataclass(frozen=True)
class ShellCall:
    """Runs a shell command through codex's shell tool (`exec_command` in 0.171.0;
    `shell_command`/`shell` in other releases), whichever the request offers."""

    command: str
    workdir: str | None = None
    call_id: str | None = None

    def as_tool_call(self, tools: Sequence[ToolRef]) -> ToolCall:
        names = {t.name for t in tools if t.namespace is None}
        extra = {"workdir": self.workdir} if self.workdir else {}
        if "exec_command" in names:
            args: JsonObject = {"cmd": self.command, "yield_time_ms": 10_000, **extra}
            return ToolCall("exec_command", args, call_id=self.call_id)
        if "shell_command" in names:
            return ToolCall("shell_command", {"command": self.command, **extra}, None, self.call_id)
        return ToolCall(
            "shell", {"command": ["bash", "-lc", self.command], **extra}, None, self.call_id
        )


Part = Message | ToolCall | ShellCall


@dataclass(frozen=True)
class Reply:
    """One model response: its output items in order, and its token usage. `delay` seconds
    pass after `response.created` (with heartbeats, so codex's idle timeout never fires)
    before the items stream: that makes a long turn to interrupt."""

    parts: tuple[Part, ...]
    usage: Usage = field(default_factory=Usage)
    delay: float = 0.0

    @classmethod
    def of(cls, *parts: Part, usage: Usage | None = None, delay: float = 0.0) -> Reply:
        return cls(parts, usage or Usage(), delay)


@dataclass(frozen=True)
class HttpError:
    """Answers the request with an HTTP error instead of a stream (e.g. 500, or 429),
    after `delay` seconds."""

    status: int = 500
    message: str = "scripted failure"
    code: str = "server_error"
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0

    def body(self) -> JsonObject:
        return {"error": {"message": self.message, "type": self.code, "code": self.code}}


Step = Reply | HttpError | Part


def as_step(step: Step) -> Reply | HttpError:
    return step if isinstance(step, Reply | HttpError) else Reply((step,))


def message(text: str, *, usage: Usage | None = None, delay: float = 0.0) -> Reply:
    return Reply((Message(text),), usage or Usage(), delay)


def delay(seconds: float, then: Step) -> Reply | HttpError:
    """`then`, after `seconds`: of a silent (but kept-alive) stream for a reply, of waiting
    for the response headers for an HTTP error."""
    return dataclasses.replace(as_step(then), delay=seconds)


def gitea_comment(
    owner: str, repo: str, issue_number: int, body: str, *, call_id: str | None = None
) -> ToolCall:
    """A comment through the thread's Gitea tools: forgeflow's own ``add_comment{body}``
    (bound to the session's issue), or an external server's ``add_comment{owner, repo,
    issue_number, body}`` (PyPI `gitea-mcp`) / ``issue_write{method: "add_comment", …}``
    (official Go server; older releases `create_issue_comment`)."""
    fields = {"owner": owner, "repo": repo, "issue_number": issue_number, "body": body}

    def arguments(tool: ToolRef) -> dict[str, Any]:
        if "owner" not in (tool.parameters.get("properties") or {}):
            return {"body": body}
        return {"method": "add_comment", **fields} if tool.name.endswith("issue_write") else fields

    return ToolCall(
        ("add_comment", "issue_write", "create_issue_comment"), arguments, None, call_id
    )


def gitea_tool(name: str, arguments: Mapping[str, Any], *, call_id: str | None = None) -> ToolCall:
    """A call of one of forgeflow's own Gitea tools (namespace ``mcp__gitea``)."""
    return ToolCall(name, dict(arguments), "mcp__gitea", call_id)


def render_item(part: Part, tools: Sequence[ToolRef]) -> JsonObject:
    """The Responses-API output item for one part, as codex parses it."""
    if isinstance(part, Message):
        return {
            "type": "message",
            "id": new_id("msg"),
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": part.text, "annotations": []}],
        }
    call = part.as_tool_call(tools) if isinstance(part, ShellCall) else part
    tool = call.resolve(tools)
    arguments = call.arguments(tool) if callable(call.arguments) else call.arguments
    item: JsonObject = {
        "type": "function_call",
        "id": new_id("fc"),
        "call_id": call.call_id or new_id("call"),
        "name": tool.name,
        "arguments": json.dumps(dict(arguments)),
        "status": "completed",
    }
    if tool.namespace is not None:
        item["namespace"] = tool.namespace
    return item


def sse(event: JsonObject) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def response_object(response_id: str, model: str, status: str, **extra: Any) -> JsonObject:
    return {"id": response_id, "object": "response", "model": model, "status": status, **extra}


def item_events(item: JsonObject, index: int) -> list[JsonObject]:
    """`output_item.added`, text deltas for a message (codex streams them as
    `item/agentMessage/delta`), then `output_item.done`, which is what codex acts on."""
    # As the real API does, the added item is still empty: codex must build the message
    # from the deltas and then take the done item as the truth.
    if item["type"] == "message":
        started = {**item, "status": "in_progress", "content": []}
    else:
        started = {**item, "status": "in_progress", "arguments": ""}
    events: list[JsonObject] = [
        {"type": "response.output_item.added", "output_index": index, "item": started}
    ]
    if item["type"] == "message":
        for part_index, content in enumerate(item["content"]):
            events.append(
                {
                    "type": "response.output_text.delta",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": part_index,
                    "delta": content["text"],
                }
            )
    events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    return events
