"""forgeflow's Gitea tools as an MCP server, built with the official ``mcp`` SDK.

The broker serves it at ``/mcp`` (streamable HTTP, stateless, JSON answers: every
request carries the session's capability, so no MCP session state is needed and an
app-server restart loses nothing). The broker resolves the capability to a
:class:`~forgeflow.agent.broker.Grant` and hands it to the SDK in the ASGI scope's
``state``; a handler reads it from the SDK's request context, so which session called
reaches the tools without a global. The grant fixes the repository and the issue or
pull request; the tools take neither.

Tools are listed in ``TOOLS`` (described for the model in docs/tools.md). An optional
external Gitea MCP server (``FORGEFLOW_GITEA_MCP_COMMAND``) adds its tools after
these, through the scope rules of ``external.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import structlog
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

import forgeflow
from forgeflow.agent.broker import GRANT_KEY, Grant
from forgeflow.agent.gitea_tools import args as a
from forgeflow.agent.gitea_tools import handlers as h
from forgeflow.agent.gitea_tools import review
from forgeflow.agent.gitea_tools.external import External
from forgeflow.agent.port import CommentTool
from forgeflow.domain.json import JsonObject
from forgeflow.domain.publish import PUSH_TOOL
from forgeflow.gitea.client import GiteaClient

log = structlog.get_logger("forgeflow.tools")

# Told of a refused call: the grant, the tool, its arguments (JSON) and why.
Refused = Callable[[Grant, str, JsonObject, str], None]


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    args: type[a.Args]
    run: Callable[[h.Session, Any], Awaitable[str]]
    read_only: bool = True


TOOLS: tuple[Tool, ...] = (
    Tool(
        "get_issue",
        "Read this issue or pull request (or another one of this repository "
        "by `number`): title, body, state, labels, author; for a pull request head and base.",
        a.IssueRef,
        h.get_issue,
    ),
    Tool(
        "list_comments",
        "List the comments of this issue or pull request (or `number`), "
        "oldest first, one page at a time.",
        a.CommentsArgs,
        h.list_comments,
    ),
    Tool(
        "add_comment",
        "Post a comment on this issue or pull request. Your answer of the "
        "turn goes here, ending with the marker line the turn gives you. Returns its id.",
        a.AddCommentArgs,
        h.add_comment,
        False,
    ),
    Tool(
        "edit_comment",
        "Change the text of a comment you posted in this session.",
        a.EditCommentArgs,
        h.edit_comment,
        False,
    ),
    Tool(
        "search_issues",
        "Search this repository's issues and pull requests by keywords.",
        a.SearchArgs,
        h.search_issues,
    ),
    Tool(
        "list_pull_files",
        "List the files a pull request changes (this one, or `number`).",
        a.IssueRef,
        h.list_pull_files,
    ),
    Tool(
        "get_pull_diff",
        "Read a pull request's unified diff, cut at `max_bytes`.",
        a.DiffArgs,
        h.get_pull_diff,
    ),
    Tool(
        "read_file",
        "Read a file of this repository at a branch, tag or commit (default "
        "branch), cut at `max_bytes`.",
        a.ReadFileArgs,
        h.read_file,
    ),
    Tool(
        "create_pull",
        "Open a pull request from this session's branch (push_branch first) "
        "into `base` (the default branch unless given).",
        a.CreatePullArgs,
        h.create_pull,
        False,
    ),
    Tool(
        "update_pull",
        "Change the title and/or body of this session's open pull request.",
        a.UpdatePullArgs,
        h.update_pull,
        False,
    ),
    Tool(
        "add_labels",
        "Add existing labels (by name) to this issue or pull request.",
        a.LabelsArgs,
        h.add_labels,
        False,
    ),
    Tool(
        "remove_labels",
        "Remove labels (by name) from this issue or pull request.",
        a.LabelsArgs,
        h.remove_labels,
        False,
    ),
    Tool(
        PUSH_TOOL,
        "Push your session branch to its branch on Gitea now (forgeflow also "
        "pushes it when your turn ends): fast-forward only, never the default branch. Call "
        "it after committing and before opening a pull request. Says what happened.",
        a.NoArgs,
        h.push_branch,
        False,
    ),
    Tool(
        "get_commit_status",
        "Read the CI statuses of this session's branch (for a pull request: of its head commit).",
        a.NoArgs,
        h.get_commit_status,
    ),
    Tool(review.NAME, review.DESCRIPTION, review.SubmitReviewArgs, review.submit_review, False),
)
COMMENT_TOOL = CommentTool("add_comment", "body: the comment's Markdown text")


def _schema(tool: Tool) -> JsonObject:
    schema: JsonObject = tool.args.model_json_schema()
    schema.pop("title", None)
    return schema


class GiteaTools:
    """The MCP server of the broker's ``/mcp``: ``__call__`` is its ASGI app, and
    :meth:`running` its lifetime (the SDK's session manager, the external server)."""

    def __init__(
        self,
        gitea: GiteaClient,
        bot_login: str,
        *,
        on_refused: Refused,
        publish: h.Publish | None = None,
        comments: h.Comments | None = None,
        external: External | None = None,
        reviews: h.SubmitReview | None = None,
    ) -> None:
        """``publish``, ``comments`` and ``reviews``: the ports behind push_branch, the
        comment tools and submit_review (built in services.py); a tool whose port is
        missing is not offered."""
        self._gitea, self._bot, self._publish = gitea, bot_login, publish
        self._comments = comments
        self._reviews = reviews
        self._on_refused = on_refused
        self._external = external
        withheld = (
            ({PUSH_TOOL} if publish is None else set())
            | ({"add_comment", "edit_comment"} if comments is None else set())
            | ({review.NAME} if reviews is None else set())
        )
        self._own = {t.name: t for t in TOOLS if t.name not in withheld}
        server: Server[Any, Any] = Server(
            "forgeflow-gitea",
            version=forgeflow.__version__,
            instructions="Gitea tools of this session's repository and issue or pull request.",
        )
        server.list_tools()(self._list)  # type: ignore[no-untyped-call]
        # Arguments are validated by the tools' pydantic models (clearer messages, and a
        # refused argument is reported), not by the SDK's JSON Schema check.
        server.call_tool(validate_input=False)(self._call)
        self._server = server
        self._manager = StreamableHTTPSessionManager(server, json_response=True, stateless=True)

    async def comment_tool(self) -> CommentTool:
        """The answer's tool; with an external server configured, that server must be up
        first (a turn's preflight: its failure code fails the task once)."""
        if self._external is not None:
            await self._external.tools(exclude=set())
        return COMMENT_TOOL

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self._manager.run():
            try:
                yield
            finally:
                if self._external is not None:
                    await self._external.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._manager.handle_request(scope, receive, send)

    def _offered(self, grant: Grant) -> dict[str, Tool]:
        """A review task's thread gets the readers and submit_review; every other
        thread all tools but submit_review (its grant says which it is)."""
        if grant.review:
            return {n: t for n, t in self._own.items() if t.read_only or n == review.NAME}
        return {n: t for n, t in self._own.items() if n != review.NAME}

    async def _list(self) -> list[types.Tool]:
        grant = self._grant()
        own = [
            types.Tool(
                name=t.name,
                description=t.description,
                inputSchema=_schema(t),
                annotations=types.ToolAnnotations(readOnlyHint=t.read_only),
            )
            for t in self._offered(grant).values()
        ]
        if self._external is None or grant.review:
            return own
        return [*own, *await self._external.tools(exclude=set(self._own))]

    def _grant(self) -> Grant:
        request = self._server.request_context.request
        state = getattr(request, "scope", {}).get("state")
        grant = state.get(GRANT_KEY) if isinstance(state, dict) else None
        assert isinstance(grant, Grant), "the broker sends every /mcp request with its grant"
        return grant

    def _session(self, grant: Grant) -> h.Session:
        # Built per call: what a session's tools remember lives in the store, not here.
        key = grant.session_key or ""
        return h.Session(
            self._gitea,
            key,
            h.resource_of(key),
            self._bot,
            self._publish,
            self._comments,
            self._reviews if grant.review else None,
        )

    def _refuse(self, grant: Grant, name: str, args: JsonObject, why: str) -> types.CallToolResult:
        self._on_refused(grant, name, args, why)
        return _error(f"refused: {why}")

    # The SDK's call_tool handler: the arguments are the JSON-RPC request's.
    async def _call(self, name: str, arguments: JsonObject) -> types.CallToolResult:
        grant = self._grant()
        tool = self._offered(grant).get(name)
        if tool is None:
            if grant.review:  # a review's thread reaches nothing else
                return self._refuse(grant, name, arguments, f"the tool {name!r} is not offered")
            if self._external is not None and await self._external.offers(name):
                why = self._external.refusal(grant, name, arguments)
                if why is not None:
                    return self._refuse(grant, name, arguments, why)
                return await self._external.call(name, arguments)
            return self._refuse(grant, name, arguments, f"the tool {name!r} is not offered")
        try:
            parsed = tool.args.model_validate(arguments)
        except ValidationError as exc:
            return self._refuse(grant, name, arguments, _invalid(exc))
        try:
            text = await tool.run(self._session(grant), parsed)
        except h.ToolRefused as exc:
            return self._refuse(grant, name, arguments, str(exc))
        except h.ToolFailed as exc:
            return _error(str(exc))
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


def _invalid(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        parts.append(f"{where}: {err['msg']}")
    return "invalid arguments: " + "; ".join(parts)


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], isError=True)
