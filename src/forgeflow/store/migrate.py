"""Alembic migrations driven from code: ``serve`` and ``migrate`` both call this."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", "forgeflow.store:migrations")
    return cfg


def upgrade(engine: Engine) -> None:
    """Bring the schema to the newest revision (idempotent)."""
    cfg = _config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def head_revision() -> str | None:
    return ScriptDirectory.from_config(_config()).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def is_current(engine: Engine) -> bool:
    return current_revision(engine) == head_revision()
