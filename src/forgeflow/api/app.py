"""The ASGI application factory."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import forgeflow
from forgeflow import web
from forgeflow.api import (
    control,
    environments,
    errors,
    hooks,
    openapi,
    ops,
    pipelines,
    transcripts,
    ui_sessions,
    webhook,
)
from forgeflow.api.limits import BodyLimits, BoundsMiddleware
from forgeflow.guard import FailureThrottle, TokenGuard
from forgeflow.metrics import Metrics
from forgeflow.services import Services
from forgeflow.store import StoreUnavailable


class _LatencyMiddleware:
    """Request latency by route template; pure ASGI so it adds almost nothing."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = [500]

        async def _send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, _send)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            self.metrics.request_latency.labels(scope["method"], path, str(status[0])).observe(
                time.perf_counter() - start
            )


def create_app(
    services: Services, *, close_on_shutdown: bool = True, lifecycle: bool = True
) -> FastAPI:
    """``lifecycle=False``: the caller starts and closes ``services`` (``forgeflow serve``
    starts the workers before this module is even imported)."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if not lifecycle:
            yield
            await services.rejections.flush()
            return
        await services.start()
        yield
        await services.rejections.flush()
        if close_on_shutdown:
            await services.aclose()

    app = FastAPI(
        title="forgeflow",
        version=forgeflow.__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.services = services
    settings = services.settings
    throttle = FailureThrottle(settings.auth_failures_allowed, settings.auth_failure_window_seconds)
    # One guard for the API and the sign-in form: a guess counts the same at either.
    app.state.guard = TokenGuard(services.admin_token, throttle, services.rejections)
    app.add_exception_handler(errors.ApiError, errors.api_error)
    app.add_exception_handler(RequestValidationError, errors.validation_error)
    app.add_exception_handler(
        StarletteHTTPException, errors.http_error_handler(web.NOT_FOUND_PAGES)
    )
    app.add_exception_handler(StoreUnavailable, errors.store_unavailable)
    app.include_router(webhook.router)
    app.include_router(hooks.router)  # POST /webhooks/{token}: pipeline webhook triggers
    app.include_router(control.router)
    app.include_router(environments.router)
    app.include_router(transcripts.router)
    app.include_router(ui_sessions.router)
    app.include_router(pipelines.router)
    app.include_router(ops.router)
    app.include_router(web.router)  # the admin pages under /ui/
    app.add_middleware(
        BoundsMiddleware, limits=BodyLimits.of(settings), guard=lambda: app.state.guard
    )
    app.add_middleware(_LatencyMiddleware, metrics=services.metrics)
    openapi.install(app)  # 400 instead of FastAPI's phantom 422
    return app
