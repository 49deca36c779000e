"""Templates, links into Gitea, and the route class that answers every admin page."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Coroutine, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias
from urllib.parse import quote, urlencode

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from jinja2 import ChainableUndefined, Environment, PackageLoader, StrictUndefined

from forgeflow.domain.ids import InvalidName, parse_repo_key, parse_resource_key
from forgeflow.services import Services
from forgeflow.web.security import (
    SECURITY_HEADERS,
    BadRequest,
    Forbidden,
    NotFound,
    SignInRequired,
    UiSession,
    Unavailable,
    clear_flash,
    read_flash,
    read_session,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

PAGE_SIZE = 50

# What a page is rendered from: its record (``web/contexts.py``), or a few names.
Context: TypeAlias = "Mapping[str, object] | DataclassInstance"

templates = Environment(
    loader=PackageLoader("forgeflow.web", "templates"),
    autoescape=True,  # everything from the store or Gitea is text, never markup
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def _when(value: str | datetime | None) -> str:
    """An ISO time as ``2024-05-01 10:00:03`` (UTC), for tables."""
    if value is None:
        return "—"
    text = value.isoformat() if isinstance(value, datetime) else value
    # A no-break space keeps date and time on one line in narrow table cells.
    return text.replace("T", "\u00a0").replace("Z", "").split(".")[0].split("+")[0]


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    return f"{s // 3600}h {s % 3600 // 60}m"


def _short(text: str | None, size: int = 80) -> str:
    if not text:
        return ""
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= size else one_line[: size - 1] + "…"


def _bytes(size: int | None) -> str:
    """A size as people read it: ``312.4 MiB``."""
    if size is None:
        return "—"
    value, unit = float(size), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"


def _qs(params: Mapping[str, str | None], **changes: str | int | None) -> str:
    """``?a=1&b=2`` from ``params`` with ``changes`` applied; empty values dropped."""
    merged: dict[str, str | int | None] = {**params, **changes}
    kept = {k: v for k, v in merged.items() if v not in (None, "") and (k, v) != ("offset", 0)}
    return "?" + urlencode(kept)


templates.filters["when"] = _when
templates.filters["age"] = _age
templates.filters["short"] = _short
templates.filters["bytes"] = _bytes
templates.globals["qs"] = _qs
templates.globals["pretty"] = lambda value: json.dumps(
    value, indent=2, ensure_ascii=False, sort_keys=True, default=str
)
templates.globals["new_request_id"] = lambda: str(uuid.uuid4())
templates.globals["path"] = lambda value: quote(value, safe="/:@")
# What users get: a value a page expects but the data lacks renders empty instead of
# failing the page. Tests run with FORGEFLOW_UI_STRICT_TEMPLATES=true (``templates``,
# StrictUndefined), so a template reading a missing value fails loudly there.
lenient = templates.overlay(undefined=ChainableUndefined)


class GiteaLinks:
    """URLs of issues, pull requests and comments on the configured Gitea."""

    def __init__(self, base_url: str | None) -> None:
        ok = base_url is not None and base_url.startswith(("http://", "https://"))
        self.base = base_url.rstrip("/") if ok and base_url else None

    def repo(self, repo_key: str | None) -> str | None:
        if self.base is None or not repo_key:
            return None
        try:
            ref = parse_repo_key(repo_key)
        except InvalidName:
            return None
        return f"{self.base}/{ref.owner}/{ref.name}"

    def resource(self, resource_key: str | None) -> str | None:
        if self.base is None or not resource_key:
            return None
        try:
            ref = parse_resource_key(resource_key)
        except InvalidName:
            return None
        part = "pulls" if ref.kind.value == "pull_request" else "issues"
        return f"{self.base}/{ref.repo.owner}/{ref.repo.name}/{part}/{ref.number}"

    def comment(self, resource_key: str | None, comment_id: int | None) -> str | None:
        page = self.resource(resource_key)
        return f"{page}#issuecomment-{comment_id}" if page and comment_id else None

    def review(self, resource_key: str | None) -> str | None:
        """Where a pull request's reviews show: its files. (Gitea's own link to a review
        is the anchor of the review's timeline comment, whose id is not the review's.)"""
        page = self.resource(resource_key)
        return f"{page}/files" if page and "/pulls/" in page else None


def services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


def _names(context: Context) -> dict[str, object]:
    """The names a template sees: a page record's fields, or a mapping's keys."""
    if isinstance(context, Mapping):
        return dict(context)
    return {f.name: getattr(context, f.name) for f in dataclasses.fields(context)}


def render(
    request: Request,
    name: str,
    context: Context,
    *,
    session: UiSession | None,
    status: int = 200,
    stamp: str | None = None,
) -> HTMLResponse:
    """Render a page; ``stamp`` (the audit change marker read with the page's data)
    makes its ``data-live`` regions update in place when something changes."""
    flash = read_flash(request) if session is not None else None
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    env = templates if services(request).settings.ui_strict_templates else lenient
    body = env.get_template(name).render(
        session=session,
        flash=flash,
        here=here,
        gitea=GiteaLinks(services(request).settings.gitea_url),
        stamp=stamp,
        **_names(context),
    )
    response = HTMLResponse(body, status_code=status)
    if session is not None:
        clear_flash(request, response)
    return response


def error_page(request: Request, status: int, title: str, message: str) -> HTMLResponse:
    return render(
        request,
        "error.html",
        {"title": title, "message": message, "nav": ""},
        session=read_session(request),
        status=status,
    )


def not_found_page(request: Request) -> HTMLResponse:
    """The page of an address under ``/ui/`` that no page answers (a typo, an old
    bookmark): the admin pages' own, not the API's JSON."""
    response = error_page(request, 404, "Not found", "no page has this address")
    response.headers.update(SECURITY_HEADERS)
    return response


Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class UiRoute(APIRoute):
    """Turns the admin pages' exceptions into pages and adds the security headers."""

    def get_route_handler(self) -> Handler:
        handler = super().get_route_handler()

        async def _handle(request: Request) -> Response:
            try:
                # PostgreSQL text cannot hold NUL: refuse it before any query sees it.
                if "\x00" in request.url.path or any(
                    "\x00" in k or "\x00" in v for k, v in request.query_params.multi_items()
                ):
                    raise BadRequest("the address holds a NUL character")
                response = await handler(request)
            except SignInRequired as exc:
                response = RedirectResponse(
                    "/ui/login?" + urlencode({"next": exc.next_url}), status_code=303
                )
            except Forbidden as exc:
                response = error_page(request, 403, "Forbidden", exc.why)
            except BadRequest as exc:
                response = error_page(request, 400, "Bad request", exc.why)
            except NotFound as exc:
                response = error_page(request, 404, "Not found", exc.what)
            except Unavailable as exc:
                response = error_page(request, 503, "Gitea unavailable", exc.why)
            except RequestValidationError as exc:
                fields = ", ".join(".".join(str(p) for p in e["loc"]) for e in exc.errors())
                response = error_page(request, 400, "Bad request", f"check: {fields}")
            response.headers.update(SECURITY_HEADERS)
            return response

        return _handle
