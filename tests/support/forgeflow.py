"""Start a real forgeflow application on a loopback socket for a test."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from forgeflow.api import create_app
from forgeflow.config import Role, Settings, load_settings
from forgeflow.services import Services, build_services
from tests.support.server import serve_app

WEBHOOK_SECRET = "whsec-test-0123456789"
ADMIN_TOKEN = "admin-test-token-abcdef"


@dataclass
class Running:
    url: str
    services: Services
    settings: Settings

    @property
    def webhook_url(self) -> str:
        return self.url + "/api/gitea/webhook"

    def admin(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30
        )


@contextmanager
def run_forgeflow(
    data_dir: Path,
    db_url: str,
    *,
    role: Role = Role.INGRESS,
    listen_port: int = 0,
    **overrides: Any,
) -> Iterator[Running]:
    """forgeflow on a loopback socket (``listen_port``, or a free one); ``role=Role.ALL``
    also runs its scheduler."""
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "database_url": db_url,
        "webhook_secret": WEBHOOK_SECRET,
        "admin_token": ADMIN_TOKEN,
        "ui_strict_templates": True,  # a page reading a missing value fails the test
    }
    values.update(overrides)
    settings = load_settings(**{k: v for k, v in values.items() if v is not None})
    services = build_services(settings, role=role)
    with serve_app(create_app(services), listen_port) as url:
        yield Running(url, services, settings)
