"""Alembic migrations driven from code: ``serve`` and ``migrate`` both call this.

Alembic is imported only when there is work for it: a start on a database that is
already current (every restart) reads one row instead. Importing Alembic costs a
restart time before its first claim, which must come within 2 s even with 10,000 tasks
queued (the restart guard-rail of docs/BENCHMARKS.md).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

if TYPE_CHECKING:
    from alembic.config import Config

_VERSIONS = Path(__file__).resolve().parent / "migrations" / "versions"
# Our revision files are named <revision>_<slug>.py and chain in that order.
_REVISION_FILE = re.compile(r"^(\d{4})_\w+\.py$")


def _config() -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", "forgeflow.store:migrations")
    return cfg


@functools.cache
def shipped_head() -> str | None:
    """The newest revision shipped with this code, from the file names (no Alembic)."""
    found = [m.group(1) for p in _VERSIONS.iterdir() if (m := _REVISION_FILE.match(p.name))]
    return max(found, default=None)


def upgrade(engine: Engine) -> None:
    """Bring the schema to the newest revision (idempotent)."""
    if current_revision(engine) == shipped_head():
        return
    from alembic import command

    cfg = _config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def head_revision() -> str | None:
    """The head as Alembic computes it from the revision chain (tests compare it)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config()).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        try:
            rows = conn.execute(text("SELECT version_num FROM alembic_version")).all()
        except DBAPIError:  # no table yet: a new database
            return None
    # Several rows would mean branches, which our linear chain never has.
    return str(rows[0][0]) if len(rows) == 1 else None


def is_current(engine: Engine) -> bool:
    return current_revision(engine) == shipped_head()
