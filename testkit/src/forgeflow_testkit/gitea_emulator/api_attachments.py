"""Attachments of issues and comments: the API's listings (routers/api/v1/repo/
issue_attachment.go, issue_comment_attachment.go), shaped as modules/structs/
attachment.go's Attachment, and the web route that serves a file,
``GET /attachments/{uuid}`` (routers/web/repo/attachment.go GetAttachment), which
takes an access token (services/auth ``isAttachmentDownload``)."""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from .api_issues import _comment, _issue
from .apibase import Call, Core, RouteSpec, authenticate, json_response, not_found
from .convert import Converter
from .state import Access, Attachment, State


def list_issue_assets(call: Call) -> Response:
    # ListIssueAttachments: the issue's own attachments (not its comments'), no paging.
    _, _, issue = _issue(call)
    found = call.state.attachments_of(issue.id)
    return json_response([call.convert.attachment(a) for a in found])


def get_issue_asset(call: Call) -> Response:
    _, _, issue = _issue(call)
    return _one(call, call.state.attachments_of(issue.id))


def list_comment_assets(call: Call) -> Response:
    _, comment = _comment(call)
    found = call.state.attachments_of(comment.issue_id, comment.id)
    return json_response([call.convert.attachment(a) for a in found])


def get_comment_asset(call: Call) -> Response:
    _, comment = _comment(call)
    return _one(call, call.state.attachments_of(comment.issue_id, comment.id))


def _one(call: Call, found: list[Attachment]) -> Response:
    # getIssueAttachmentSafeRead: an id that is not this issue's (comment's) is a 404.
    wanted = call.int_param("attachment_id")
    for attachment in found:
        if attachment.id == wanted:
            return json_response(call.convert.attachment(attachment))
    raise not_found()


_ISSUE = "/repos/{owner}/{repo}/issues/{index}/assets"
_COMMENT = "/repos/{owner}/{repo}/issues/comments/{id}/assets"
ROUTES: list[RouteSpec] = [
    ("GET", _ISSUE, list_issue_assets),
    ("GET", _ISSUE + "/{attachment_id}", get_issue_asset),
    ("GET", _COMMENT, list_comment_assets),
    ("GET", _COMMENT + "/{attachment_id}", get_comment_asset),
]


def web_routes(core: Core) -> list[Route]:
    async def endpoint(request: Request) -> Response:
        return serve(core, request)

    return [Route("/attachments/{uuid}", endpoint, methods=["GET"])]


def serve(core: Core, request: Request) -> Response:
    """GetAttachment: 404 unless the caller can read the repository it belongs to;
    the file as ServeContentByReadSeeker sends it (a sniffed type, the name)."""
    state = core.state
    with state.lock:
        doer = authenticate(state, request.headers.get("authorization", ""), {})
        found = next(
            (a for a in state.attachments.values() if a.uuid == request.path_params["uuid"]),
            None,
        )
        if found is None or state.access(state.repos[found.repo_id], doer) < Access.READ:
            return PlainTextResponse("Not Found\n", 404)
        found.download_count += 1
        data = found.data
    return Response(
        data,
        200,
        media_type=_sniffed(data),
        headers={"Content-Disposition": f'inline; filename="{found.name}"'},
    )


def _sniffed(data: bytes) -> str:
    # typesniffer: images by their signature, everything else as octet-stream.
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    return "application/octet-stream"


class AttachmentControls:
    """The emulator's way to attach a file (a mixin of GiteaEmulator)."""

    _state: State
    _convert: Converter

    def attach(
        self,
        owner: str,
        repo: str,
        index: int,
        *,
        name: str,
        data: bytes,
        author: str,
        comment_id: int = 0,
    ) -> dict[str, Any]:
        """Attach ``data`` as ``name`` to an issue (or to its comment ``comment_id``);
        returns the Attachment as the API shows it."""
        with self._state.lock:
            target = self._state.repo_by_name(owner, repo)
            issue = self._state.issue_by_index(target, index)
            if comment_id and self._state.comment(comment_id).issue_id != issue.id:
                raise LookupError(f"comment {comment_id} is not on #{index}")
            attachment = Attachment(
                id=self._state.next_id("attachment"),
                uuid=str(uuidlib.uuid4()),
                repo_id=target.id,
                issue_id=issue.id,
                comment_id=comment_id,
                uploader_id=self._state.user_by_login(author).id,
                name=name,
                data=data,
                created=self._state.now(),
            )
            self._state.attachments[attachment.id] = attachment
            return self._convert.attachment(attachment)
