"""The objects one forgeflow process shares: settings, store, Gitea client, metrics."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from forgeflow.config import Settings
from forgeflow.gitea.client import GiteaClient, PermissionCache
from forgeflow.ingress import WebhookIngress
from forgeflow.metrics import Metrics
from forgeflow.redaction import register_secrets
from forgeflow.store import Store

ADMIN_TOKEN_FILE = "admin_token"  # noqa: S105 - a file name, not a secret


@dataclass
class Services:
    settings: Settings
    store: Store
    metrics: Metrics
    ingress: WebhookIngress
    gitea: GiteaClient | None
    admin_token: str

    async def aclose(self) -> None:
        if self.gitea is not None:
            await self.gitea.aclose()
        self.store.close()


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


def build_services(settings: Settings, *, migrate: bool = True) -> Services:
    admin_token, _ = ensure_admin_token(settings)
    settings.admin_token = SecretStr(admin_token)
    register_secrets(settings.secret_values())
    store = Store(settings.resolved_database_url)
    if migrate:
        store.migrate()
    gitea = None
    permissions = None
    if settings.gitea_url is not None:
        token = settings.gitea_token.get_secret_value() if settings.gitea_token else None
        gitea = GiteaClient(settings.gitea_url, token)
        permissions = PermissionCache(gitea, settings.permission_cache_seconds)
    return Services(
        settings=settings,
        store=store,
        metrics=Metrics(),
        ingress=WebhookIngress(settings, store, permissions),
        gitea=gitea,
        admin_token=admin_token,
    )
