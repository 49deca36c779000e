"""Build a process's PipelineEngine: built-in bodies, port adapters, settings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from forgeflow.agent.oneshot import JailRunner
from forgeflow.config import Settings
from forgeflow.gitea.client import GiteaClient
from forgeflow.pipelines.adapters import GiteaAdapter, LocalWorkspace, StoreAgentDispatch
from forgeflow.pipelines.bodies import register_builtins
from forgeflow.pipelines.engine import PipelineEngine
from forgeflow.pipelines.ports import ReviewPort
from forgeflow.pipelines.registry import PipelineBodyRegistry
from forgeflow.store import Store
from forgeflow.workspace.manager import WorkspaceManager


def build_engine(
    settings: Settings,
    store: Store,
    manager: WorkspaceManager,
    *,
    gitea: GiteaClient | None,
    owner: str,
    node_prefix: str,
    wake_tasks: Callable[[], None] | None = None,
    reviews: ReviewPort | None = None,
) -> PipelineEngine:
    """No I/O here: the loop starts with :meth:`PipelineEngine.start_loop`. ``manager``:
    the process's one workspace manager, the tasks' too (its locks must cover both).
    ``reviews``: review tasks for ``conversation.reviewPullRequest`` (tasks/review_asks)."""
    registry = PipelineBodyRegistry()
    register_builtins(registry)
    root = str(settings.resolved_workspace_root)
    workspace = LocalWorkspace(
        root,
        str(Path(settings.data_dir) / "pipelines"),
        manager,
        jail_runner=JailRunner.from_settings(settings),
        store=store,
    )
    return PipelineEngine(
        store,
        registry,
        owner=owner,
        node_prefix=node_prefix,
        workspace=workspace,
        agent=StoreAgentDispatch(store, workspace_root=root, gitea=gitea, wake=wake_tasks),
        gitea=GiteaAdapter(gitea, settings.bot_login) if gitea is not None else None,
        reviews=reviews,
        lease_ttl=settings.lease_ttl_seconds,
        poll_seconds=settings.poll_seconds,
    )
