"""The admin pages under ``/ui/``: server-rendered, usable without JavaScript, with
regions that update in place while state changes (see docs/ui.md)."""

from __future__ import annotations

from fastapi import APIRouter

from forgeflow.web import actions, conversation, feeds, pages, pipeline_hooks, pipelines

router = APIRouter()
router.include_router(pages.entry)
router.include_router(pages.router)
router.include_router(conversation.router)
router.include_router(actions.router)
router.include_router(pipelines.router)
router.include_router(pipeline_hooks.router)
router.include_router(feeds.router)
router.include_router(feeds.assets)

__all__ = ["router"]
