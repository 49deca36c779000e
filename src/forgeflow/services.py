"""The objects one forgeflow process shares: settings, store, Gitea client, workers."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import socket
import uuid
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
from pydantic import SecretStr
from sqlalchemy.exc import SQLAlchemyError

from forgeflow.agent.port import AgentRuntime
from forgeflow.config import Role, Settings
from forgeflow.domain.retry import RetryPolicy
from forgeflow.gitea.client import GiteaClient, PermissionCache
from forgeflow.gitea.oauth import OAuthClient
from forgeflow.gitea.oauth_apps import read_client
from forgeflow.metrics import Metrics
from forgeflow.pipelines.engine import PipelineEngine
from forgeflow.pipelines.seeds import seed_builtins
from forgeflow.pipelines.triggers import TriggerLoops
from forgeflow.pipelines.wiring import build_engine
from forgeflow.redaction import register_secrets
from forgeflow.rejections import RejectionLog
from forgeflow.store import Store, StoreUnavailable
from forgeflow.store import environments as environments_q
from forgeflow.tasks.dispatch import Wakeup
from forgeflow.tasks.intake import WebhookIngress
from forgeflow.tasks.review_asks import ReviewAsks
from forgeflow.tasks.threads import ReviewThreads
from forgeflow.workspace.manager import WorkspaceManager

if TYPE_CHECKING:
    from forgeflow.tasks.environment import Environments
    from forgeflow.tasks.scheduler import Scheduler
    from forgeflow.tasks.wiring import Process

ADMIN_TOKEN_FILE = "admin_token"  # noqa: S105 - a file name, not a secret
log = structlog.get_logger("forgeflow.services")


@dataclass
class Services:
    settings: Settings
    store: Store
    metrics: Metrics
    ingress: WebhookIngress
    gitea: GiteaClient | None
    admin_token: str
    # The bounded audit of requests refused at the door (forgeflow.rejections).
    rejections: RejectionLog
    # The one manager of this process's clones, shared by tasks and pipelines: its
    # per-repository lock orders a pipeline's cleanup after a task's git work.
    workspace: WorkspaceManager
    # Set by ingress when it accepts a task; the scheduler (if this process runs one)
    # claims at once instead of at its next poll. Built once, in build_services.
    wakeup: Wakeup
    role: Role = Role.ALL
    worker_id: str = ""
    owner: str = ""
    runtime: AgentRuntime | None = None
    scheduler: Scheduler | None = field(default=None)
    pipelines: PipelineEngine | None = field(default=None)
    triggers: TriggerLoops | None = field(default=None)
    # Review threads (#24 item 4): shared by the intake, the prompts and the answers.
    threads: ReviewThreads | None = field(default=None)
    # Sign in with Gitea (web/gitea_auth.py): None while no OAuth2 client is configured.
    oauth: OAuthClient | None = field(default=None)

    @property
    def retry(self) -> RetryPolicy:
        s = self.settings
        return RetryPolicy(max_retries=s.max_retries, base_seconds=s.retry_base_seconds)

    def worker_blockers(self) -> list[str]:
        """Why this process cannot run tasks, one line each (empty when it can)."""
        lines = []
        if self.role is Role.INGRESS:
            lines.append("role ingress: this process does not run tasks")
        if self.gitea is None or self.settings.gitea_token is None:
            lines.append(
                "tasks wait in the queue until FORGEFLOW_GITEA_URL and "
                "FORGEFLOW_GITEA_TOKEN are set"
            )
        return lines

    async def start(self) -> None:
        """Start the scheduler when this process runs tasks and can, seed the built-in
        pipeline templates (every role: idempotent and safe with several processes
        starting at once), then the pipeline engine unless this process is ingress only
        (after the duplicate-worker check: both recover what a dead predecessor with
        this worker id left running)."""
        # Setup secrets are masked in this process's logs like its own secrets (#26).
        with contextlib.suppress(SQLAlchemyError, StoreUnavailable):  # not migrated: none
            register_secrets(await self.store.read(environments_q.all_secret_values))
        # The scheduler first: a restart claims queued work before anything optional.
        await self._start_scheduler()
        await self.first_claims()
        if self.pipelines is not None:
            await seed_builtins(self.store, self.pipelines.registry.keys())
        if self.pipelines is not None and self.role is not Role.INGRESS:
            await self.pipelines.start_loop()
            if self.triggers is not None:  # domain events and schedules start runs
                await self.triggers.start()

    async def first_claims(self, timeout: float = 2.0) -> None:
        """Wait (at most ``timeout``) until the scheduler made its first claim round."""
        if self.scheduler is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.scheduler.first_round_done.wait(), timeout)

    def environments(self) -> Environments:
        """The repositories' environments (#26)."""
        from forgeflow.tasks.environment import Environments

        return Environments.from_settings(self.store, self.settings, forbidden_paths(self.settings))

    async def _start_scheduler(self) -> None:
        if self.worker_blockers():
            return
        from forgeflow.agent.factory import RuntimeUnavailable, create_runtime
        from forgeflow.tasks.publish import Publisher
        from forgeflow.tasks.reviews import PullReviews
        from forgeflow.tasks.tool_comments import ToolComments
        from forgeflow.tasks.wiring import build_scheduler

        s = self.settings
        assert s.gitea_token is not None and self.gitea is not None
        publisher = Publisher(self.store, self.workspace)
        comments = ToolComments(self.store, self.gitea, s.bot_login, self.threads)
        reviews = PullReviews(
            self.store, self.gitea, s.bot_login, allowed_events=s.review_allowed()
        )
        environments = self.environments()
        try:
            self.runtime = create_runtime(
                s, publisher.for_session, comments, reviews.tool, environments
            )
        except RuntimeUnavailable as exc:
            log.warning("worker.unavailable", reason=str(exc))
            return
        scheduler = build_scheduler(self._process(), publisher, self.runtime, reviews, environments)
        await self._register_worker()
        self.scheduler = scheduler
        await scheduler.start()

    def _process(self) -> Process:
        """What this process shares with the task runner it builds."""
        from forgeflow.tasks.wiring import Process

        assert self.gitea is not None
        return Process(
            settings=self.settings,
            store=self.store,
            gitea=self.gitea,
            workspace=self.workspace,
            wakeup=self.wakeup,
            retry=self.retry,
            worker_id=self.worker_id,
            owner=self.owner,
            threads=self.threads,
        )

    async def _register_worker(self) -> None:
        """Refuse to run beside a live process with the same worker id: both would take
        the other's leases for a dead predecessor's."""
        from forgeflow.store import workers

        host, pid = socket.gethostname(), os.getpid()
        previous = await self.store.write(
            partial(
                workers.register, worker_id=self.worker_id, owner=self.owner, host=host, pid=pid
            )
        )
        if (
            previous is not None
            and previous.owner != self.owner
            and previous.host == host
            and previous.pid != pid
            and _alive(previous.pid)
        ):
            raise WorkerIdInUse(
                f"another forgeflow process (pid {previous.pid}) runs with worker id "
                f"{self.worker_id!r}; give each worker its own FORGEFLOW_WORKER_ID"
            )

    async def aclose(self) -> None:
        if self.triggers is not None:
            await self.triggers.stop()
        if self.pipelines is not None:
            await self.pipelines.stop()
        if self.scheduler is not None:
            await self.scheduler.stop()
        if self.runtime is not None:
            await self.runtime.aclose()
        if self.gitea is not None:
            await self.gitea.aclose()
        if self.oauth is not None:
            await self.oauth.aclose()
        self.store.close()


class WorkerIdInUse(RuntimeError):
    code = "worker_id_in_use"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def forbidden_paths(settings: Settings) -> tuple[str, ...]:
    """Host paths no environment may bind, wherever the operator put them: forgeflow's
    data, the workspace, the environments' roots (their lock files: a jail holding one
    would stall every build of that list), the operator's Codex configuration (the
    model's credentials) and forgeflow's configuration file (its tokens)."""
    paths = [Path(settings.data_dir), settings.resolved_workspace_root]
    paths += [settings.resolved_environment_roots]
    paths += [p for p in (settings.codex_home_path, settings.toml_file) if p is not None]
    return tuple(dict.fromkeys(str(p.resolve()) for p in paths))


def ensure_admin_token(settings: Settings) -> tuple[str, bool]:
    """The admin token, generated once into the data folder (0600) when not configured.

    Returns the token and whether it was generated just now (then it is printed once).
    """
    if settings.admin_token is not None:
        return settings.admin_token.get_secret_value(), False
    path = Path(settings.data_dir) / ADMIN_TOKEN_FILE
    if path.is_file():
        return path.read_text().strip(), False
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    return token, True


def default_worker_id(settings: Settings) -> str:
    """Stable across restarts of the same installation, so a restart can tell its own
    predecessor's leases apart from another live worker's."""
    if settings.worker_id:
        return settings.worker_id
    where = str(Path(settings.data_dir).resolve())
    return f"{socket.gethostname()}-{hashlib.sha256(where.encode()).hexdigest()[:8]}"


def build_services(settings: Settings, *, migrate: bool = True, role: Role = Role.ALL) -> Services:
    admin_token, _ = ensure_admin_token(settings)
    settings.admin_token = SecretStr(admin_token)
    oauth = _oauth_client(settings)
    register_secrets(settings.secret_values(), usernames=(settings.bot_login,))
    store = Store(settings.resolved_database_url)
    if migrate:
        store.migrate()
    gitea = None
    permissions = None
    threads = None
    if settings.gitea_url is not None:
        token = settings.gitea_token.get_secret_value() if settings.gitea_token else None
        gitea = GiteaClient(settings.gitea_url, token)
        permissions = PermissionCache(gitea, settings.permission_cache_seconds)
        threads = ReviewThreads(gitea, settings.bot_login)
    worker_id = default_worker_id(settings)
    workspace = WorkspaceManager.from_settings(settings)
    wakeup = Wakeup()
    rejections = RejectionLog(
        store, settings.rejection_interval_seconds, settings.rejection_retention_days
    )
    services = Services(
        settings=settings,
        store=store,
        metrics=Metrics(),
        ingress=WebhookIngress(
            settings, store, permissions, rejections, on_accept=wakeup.set, threads=threads
        ),
        rejections=rejections,
        workspace=workspace,
        wakeup=wakeup,
        gitea=gitea,
        admin_token=admin_token,
        role=role,
        worker_id=worker_id,
        owner=f"{worker_id}/{uuid.uuid4().hex[:12]}",
        threads=threads,
        oauth=oauth,
    )

    services.pipelines = build_engine(
        settings,
        store,
        workspace,
        gitea=gitea,
        owner=services.owner,
        node_prefix=f"{worker_id}/",
        wake_tasks=wakeup.set,  # a pipeline queued an agent task: claim it now
        reviews=ReviewAsks(store, services.ingress, gitea),
    )
    services.triggers = TriggerLoops(store, services.pipelines, poll_seconds=settings.poll_seconds)
    return services


def _oauth_client(settings: Settings) -> OAuthClient | None:
    """The OAuth2 client of "Sign in with Gitea": configured, or the one ``forgeflow gitea
    connect --oauth`` stored in the data folder; None without Gitea or a public URL."""
    if settings.oauth_client_id is None:
        stored = read_client(Path(settings.data_dir))
        if stored is not None:
            settings.oauth_client_id, settings.oauth_client_secret = stored
    secret = settings.oauth_client_secret
    if settings.gitea_url is None or settings.public_url is None:
        return None
    if settings.oauth_client_id is None or secret is None:
        return None
    return OAuthClient(settings.gitea_url, settings.oauth_client_id, secret.get_secret_value())
