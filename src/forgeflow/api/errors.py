"""Error responses: ``{"error": <stable code>, "message": <for people>}``."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": code, "message": message, **extra}


async def api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return JSONResponse(error_body(exc.code, exc.message, **exc.extra), status_code=exc.status)


async def validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{where}: {err.get('msg')}")
    return JSONResponse(
        error_body("invalid_request", "; ".join(parts) or "invalid request"), status_code=400
    )


PageHandler = Callable[[Request], Response]
Handler = Callable[[Request, Exception], Coroutine[Any, Any, Response]]


def http_error_handler(not_found_pages: Mapping[str, PageHandler]) -> Handler:
    """The handler of Starlette's HTTP errors: JSON, except a 404 under a path prefix of
    ``not_found_pages``, which gets that prefix's page. The web package hands its page
    in when the app is built (api/app.py): the API knows no page of its own."""

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 404:
            for prefix, page in not_found_pages.items():
                if request.url.path.startswith(prefix):
                    return page(request)
        code = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed"}.get(
            exc.status_code, "http_error"
        )
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            headers["Allow"] = _allowed_methods(request)
        return JSONResponse(
            error_body(code, str(exc.detail)), status_code=exc.status_code, headers=headers
        )

    return http_error


def _allowed_methods(request: Request) -> str:
    """Every method some route serves at this path. Starlette's 405 names only the first
    route whose path matched, but FastAPI makes one route per method (GET and POST
    ``/api/pipelines/templates`` are two), and RFC 9110 wants them all in ``Allow``.
    Asked through the public ``matches`` with each method, since FastAPI nests included
    routers (its route objects are not a flat list)."""
    routes = request.app.router.routes
    return ", ".join(
        method
        for method in _METHODS
        if any(r.matches({**request.scope, "method": method})[0] is Match.FULL for r in routes)
    )


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


async def store_unavailable(_: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(
        error_body("store_unavailable", "the database is unavailable; retry"), status_code=503
    )
