"""Choose the agent runtime named by ``FORGEFLOW_AGENT_RUNTIME``.

``codex`` (the default) is the Codex app-server adapter. ``module:attribute`` names a
factory ``(settings) -> AgentRuntime``; the test suite and benchmarks use it for
runtimes that exercise the scheduler without a model.
"""

from __future__ import annotations

import importlib
from typing import Any, cast

from forgeflow.agent.gitea_tools import Comments, Publish
from forgeflow.agent.gitea_tools.handlers import SubmitReview
from forgeflow.agent.jail import Systems
from forgeflow.agent.port import AgentRuntime
from forgeflow.agent.provider import ProviderError
from forgeflow.config import Settings


class RuntimeUnavailable(Exception):
    code = "runtime_unavailable"


def create_runtime(
    settings: Settings,
    publish: Publish | None = None,
    comments: Comments | None = None,
    reviews: SubmitReview | None = None,
    systems: Systems | None = None,
) -> AgentRuntime:
    """``systems``: each repository's environment (its jail's system, #26);
    ``publish``: the session's push, offered to the agent as its ``push_branch`` tool;
    ``comments``: the records behind its ``add_comment`` and ``edit_comment`` tools;
    ``reviews``: the one review behind a review task's ``submit_review``."""
    name = settings.agent_runtime
    if name == "codex":
        try:
            codex = importlib.import_module("forgeflow.agent.codex")
        except ImportError as exc:
            raise RuntimeUnavailable(f"the Codex runtime cannot be loaded: {exc}") from None
        try:
            return cast(
                AgentRuntime,
                codex.CodexRuntime.from_settings(settings, publish, comments, reviews, systems),
            )
        except ProviderError as exc:
            raise RuntimeUnavailable(f"the model provider: {exc}") from None
    module_name, _, attr = name.partition(":")
    if not attr:
        raise RuntimeUnavailable(
            f"FORGEFLOW_AGENT_RUNTIME={name!r} is neither 'codex' nor 'module:factory'"
        )
    factory: Any = getattr(importlib.import_module(module_name), attr)
    return cast(AgentRuntime, factory(settings))
