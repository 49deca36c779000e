"""ScriptedModel: an OpenAI Responses-API server that plays the model for the real
`codex app-server` in tests.

Codex (0.171.0, `wire_api = "responses"`) sends `POST {base_url}/responses` with a JSON body
(`model`, `input`, `tools`, `stream: true`, …) and reads the answer as server-sent events. It
acts on `response.output_item.done` and needs `response.completed` (whose `response.usage`
becomes `thread/tokenUsage/updated`); a stream that ends without it fails the turn. We also
send what the real API sends around them (`response.created`, `response.output_item.added`,
`response.output_text.delta`), so codex streams `item/agentMessage/delta` as in production.

Each request is answered by the first matching rule (`when`), else the next queued step
(`enqueue`), else the default step; with none of these it gets HTTP 500."""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .gitea_emulator.server import BackgroundServer
from .model_steps import (
    Arguments,
    HttpError,
    JsonObject,
    Message,
    Reply,
    ScriptError,
    ShellCall,
    Step,
    ToolCall,
    ToolRef,
    Usage,
    as_step,
    delay,
    gitea_comment,
    item_events,
    match_tool,
    message,
    new_id,
    offered_tools,
    render_item,
    response_object,
    sse,
)

__all__ = [
    "HttpError",
    "Message",
    "RecordedRequest",
    "Reply",
    "ScriptedModel",
    "ShellCall",
    "Step",
    "ToolCall",
    "ToolRef",
    "Usage",
    "delay",
    "gitea_comment",
    "last_input_is_tool_output",
    "message",
]

# Keeps a delayed stream alive: codex resets its idle timer on every SSE event, and ignores
# event types it does not know.
_HEARTBEAT_SECONDS = 0.5


@dataclass(frozen=True)
class RecordedRequest:
    """One HTTP request codex made to the model server, kept for assertions."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: JsonObject
    received_at: float = field(default_factory=time.monotonic)

    @property
    def input(self) -> list[JsonObject]:
        items = self.body.get("input") or []
        return [i for i in items if isinstance(i, dict)]

    @property
    def last_input(self) -> JsonObject | None:
        return self.input[-1] if self.input else None

    @property
    def tools(self) -> list[ToolRef]:
        return offered_tools(self.body.get("tools") or [])

    def tool(self, name: str, namespace: str | None = None) -> ToolRef | None:
        """The offered tool called `name` (bare or `mcp__server__name`), if any."""
        return match_tool(self.tools, name, namespace)

    @property
    def instructions(self) -> str:
        """The `instructions` field, or (codex 0.171.0 sends none) the first developer
        message, which carries codex's base instructions."""
        value = self.body.get("instructions")
        if isinstance(value, str):
            return value
        return next(iter(self.texts("developer")), "")

    def function_call_outputs(self) -> list[JsonObject]:
        return [i for i in self.input if i.get("type") == "function_call_output"]

    def texts(self, role: str) -> list[str]:
        """The text of every input message of `role` (`developer`, `user`, `assistant`)."""
        found: list[str] = []
        for item in self.input:
            if item.get("type") == "message" and item.get("role") == role:
                for part in item.get("content") or []:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        found.append(part["text"])
        return found


Predicate = Callable[[RecordedRequest], bool]


def last_input_is_tool_output(call_id: str | None = None) -> Predicate:
    """True for the request that carries a tool's result back to the model."""

    def check(request: RecordedRequest) -> bool:
        last = request.last_input
        return (
            last is not None
            and last.get("type") == "function_call_output"
            and call_id in (None, last.get("call_id"))
        )

    return check


Responder = Callable[[RecordedRequest], "Step"]


@dataclass
class _Rule:
    when: Predicate
    step: Reply | HttpError | Responder
    times: int | None


class ScriptedModel:
    """Plays the model for codex. Script it with `enqueue` (a FIFO of steps, one per model
    request) and `when` (rules checked first, e.g. "the last input item is a tool's output →
    answer with this message"). A request nothing answers gets HTTP 500 and is listed in
    `errors`, so a test fails loudly rather than hanging. `url` is the provider `base_url`."""

    def __init__(self, *, model: str = "scripted-model", default: Step | None = None) -> None:
        self.model = model
        self._default = as_step(default) if default is not None else None
        self._queue: collections.deque[Reply | HttpError] = collections.deque()
        self._rules: list[_Rule] = []
        self._requests: list[RecordedRequest] = []
        self._errors: list[str] = []
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        app = Starlette(
            routes=[
                Route("/v1/responses", self._responses, methods=["POST"]),
                Route("/{path:path}", self._unexpected, methods=["GET", "POST", "PUT", "DELETE"]),
            ]
        )
        self._server = BackgroundServer(app)

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"{self._server.url}/v1"

    def start(self) -> ScriptedModel:
        self._stopping.clear()
        self._server.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # ends delayed streams at once, so shutdown does not wait
        self._server.stop()

    def __enter__(self) -> ScriptedModel:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- scripting ------------------------------------------------------------------------

    def enqueue(self, *steps: Step) -> ScriptedModel:
        with self._changed:
            self._queue.extend(as_step(s) for s in steps)
        return self

    def when(self, predicate: Predicate, step: Step, *, times: int | None = 1) -> ScriptedModel:
        """Answer requests matching `predicate` with `step`, `times` times (None: always)."""
        with self._changed:
            self._rules.append(_Rule(predicate, as_step(step), times))
        return self

    def respond(
        self,
        predicate: Predicate,
        responder: Responder,
        *,
        times: int | None = None,
        first: bool = False,
    ) -> ScriptedModel:
        """Like `when`, but the step is computed from the request (e.g. an agent that
        answers with the marker it was given in the prompt); `first` puts the rule ahead
        of the rules already there."""
        with self._changed:
            rule = _Rule(predicate, responder, times)
            if first:
                self._rules.insert(0, rule)
            else:
                self._rules.append(rule)
        return self

    def after_tool_output(
        self, step: Step, *, call_id: str | None = None, times: int | None = 1
    ) -> ScriptedModel:
        return self.when(last_input_is_tool_output(call_id), step, times=times)

    def reply_with_tool_then_message(
        self,
        tool: str | Sequence[str] | ToolCall,
        arguments: Arguments | None = None,
        final: str = "done",
        *,
        namespace: str | None = None,
        usage: Usage | None = None,
    ) -> str:
        """Next request: call `tool` (a name, candidate names, or a ready ToolCall such as
        `gitea_comment(...)`); the request carrying its output: say `final`. Returns the
        call id, to find the `function_call_output` in `requests`."""
        call_id = new_id("call")
        if isinstance(tool, ToolCall):
            call = ToolCall(tool.tool, tool.arguments, tool.namespace, call_id)
        else:
            call = ToolCall(tool, arguments or {}, namespace, call_id)
        self.enqueue(Reply.of(call, usage=usage))
        self.after_tool_output(Reply.of(Message(final), usage=usage), call_id=call_id)
        return call_id

    def reply_with_shell_then_message(
        self, command: str, final: str = "done", *, usage: Usage | None = None
    ) -> str:
        """Next request: run `command` with codex's shell tool; then say `final`."""
        call_id = new_id("call")
        self.enqueue(Reply.of(ShellCall(command, call_id=call_id), usage=usage))
        self.after_tool_output(Reply.of(Message(final), usage=usage), call_id=call_id)
        return call_id

    # -- what happened --------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._changed:
            return list(self._requests)

    @property
    def errors(self) -> list[str]:
        with self._changed:
            return list(self._errors)

    @property
    def pending(self) -> int:
        """Steps still queued (rules not counted)."""
        with self._changed:
            return len(self._queue)

    def wait_for_requests(self, count: int, timeout: float = 10.0) -> list[RecordedRequest]:
        with self._changed:
            if not self._changed.wait_for(lambda: len(self._requests) >= count, timeout):
                raise TimeoutError(f"{len(self._requests)} of {count} model requests arrived")
            return list(self._requests)

    # -- HTTP -----------------------------------------------------------------------------

    def _record(self, request: Request, body: JsonObject) -> RecordedRequest:
        recorded = RecordedRequest(
            request.method,
            request.url.path,
            {k.lower(): v for k, v in request.headers.items()},
            body,
        )
        with self._changed:
            self._requests.append(recorded)
            self._changed.notify_all()
        return recorded

    def _fail(self, message: str, status: int = 500) -> Response:
        with self._changed:
            self._errors.append(message)
        return JSONResponse({"error": {"message": message, "type": "scripted_model"}}, status)

    def _next_step(self, request: RecordedRequest) -> Reply | HttpError:
        with self._changed:
            for rule in self._rules:
                if rule.times != 0 and rule.when(request):
                    if rule.times is not None:
                        rule.times -= 1
                    if isinstance(rule.step, Reply | HttpError):
                        return rule.step
                    return as_step(rule.step(request))
            if self._queue:
                return self._queue.popleft()
            if self._default is not None:
                return self._default
        raise ScriptError(f"no scripted step left for model request #{len(self.requests)}")

    async def _unexpected(self, request: Request) -> Response:
        raw = await request.body()
        self._record(request, {"raw": raw.decode("utf-8", "replace")})
        return self._fail(f"unexpected {request.method} {request.url.path}", 404)

    async def _responses(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            # codex may compress request bodies for some providers; we must see them plain
            self._record(request, {"raw": raw.decode("utf-8", "replace")})
            return self._fail(
                f"request body is not a JSON object ({request.headers.get('content-encoding')})"
            )
        recorded = self._record(request, body)
        items: list[JsonObject] = []
        try:
            step = self._next_step(recorded)
            if not isinstance(step, HttpError):
                items = [render_item(part, recorded.tools) for part in step.parts]
        except ScriptError as error:
            return self._fail(str(error))
        if isinstance(step, HttpError):
            await asyncio.sleep(step.delay)
            return JSONResponse(step.body(), step.status, headers=dict(step.headers))
        return StreamingResponse(
            self._stream(step, items, str(body.get("model") or self.model)),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache"},
        )

    async def _stream(
        self, step: Reply, items: list[JsonObject], model: str
    ) -> AsyncIterator[bytes]:
        response_id = new_id("resp")
        yield sse(
            {
                "type": "response.created",
                "response": response_object(response_id, model, "in_progress"),
            }
        )
        deadline = time.monotonic() + step.delay
        while time.monotonic() < deadline:
            if self._stopping.is_set():
                return  # no response.completed: codex sees a broken stream
            await asyncio.sleep(min(_HEARTBEAT_SECONDS, max(0.0, deadline - time.monotonic())))
            yield sse(
                {
                    "type": "response.in_progress",
                    "response": response_object(response_id, model, "in_progress"),
                }
            )
        for index, item in enumerate(items):
            for event in item_events(item, index):
                yield sse(event)
        completed = response_object(
            response_id, model, "completed", output=items, usage=step.usage.to_json()
        )
        yield sse({"type": "response.completed", "response": completed})
