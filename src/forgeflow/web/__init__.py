"""The admin pages under ``/ui/``: server-rendered, usable without JavaScript, with
regions that update in place while state changes (see docs/ui.md)."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, Request, Response

from forgeflow.web import (
    actions,
    conversation,
    feeds,
    gitea_auth,
    pages,
    pipeline_hooks,
    pipelines,
    repo_page,
)
from forgeflow.web.render import not_found_page

router = APIRouter()
router.include_router(pages.entry)
router.include_router(pages.router)
router.include_router(repo_page.router)
router.include_router(conversation.router)
router.include_router(actions.router)
router.include_router(gitea_auth.router)
router.include_router(pipelines.router)
router.include_router(pipeline_hooks.router)
router.include_router(feeds.router)
router.include_router(feeds.assets)

# The page of an address under /ui/ that no page answers; the app's HTTP-error handler
# serves it (api/errors.py takes it from here: the API does not reach into the pages).
NOT_FOUND_PAGES: dict[str, Callable[[Request], Response]] = {"/ui/": not_found_page}

__all__ = ["NOT_FOUND_PAGES", "router"]
