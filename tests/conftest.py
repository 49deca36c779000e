"""Fixtures shared by every kind of test: real databases and real servers."""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import psycopg
import pytest

from forgeflow.store import Store

PG_ADMIN_DSN = os.environ.get("FORGEFLOW_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _pg_admin(sql: str) -> None:
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(sql)  # type: ignore[arg-type]


def _pg_url(name: str) -> str:
    base = PG_ADMIN_DSN.rsplit("/", 1)[0]
    return base.replace("postgresql://", "postgresql+psycopg://", 1) + "/" + name


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """A migrated template database, built once; tests copy it (procrastinate's trick)."""
    name = f"ff_tpl_{uuid.uuid4().hex[:10]}"
    _pg_admin(f'CREATE DATABASE "{name}"')
    store = Store(_pg_url(name))
    try:
        store.migrate()
    finally:
        store.close()
    yield name
    _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url(pg_template: str) -> Iterator[str]:
    name = f"ff_t_{uuid.uuid4().hex[:12]}"
    _pg_admin(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    yield _pg_url(name)
    _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite database, built once; each test gets a copy (as ``pg_template``):
    the migrations cost most of a second per database on a busy machine."""
    path = tmp_path_factory.mktemp("sqlite-template") / "forgeflow.db"
    store = Store(f"sqlite:///{path}")
    try:
        store.migrate()
    finally:
        store.close()
    return path


@pytest.fixture
def sqlite_url(tmp_path: Path, sqlite_template: Path) -> str:
    path = tmp_path / "forgeflow.db"
    # The backup API copies a consistent database whatever its journal mode left beside it.
    with closing(sqlite3.connect(sqlite_template)) as src, closing(sqlite3.connect(path)) as dst:
        src.backup(dst)
    return f"sqlite:///{path}"


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Each test that takes this runs on both drivers."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store(db_url)
    s.migrate()
    yield s
    s.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Figures that tests recorded with ``record_property("figures", text)``."""
    texts = [
        str(value)
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"
        for name, value in getattr(report, "user_properties", ())
        if name == "figures"
    ]
    if texts:
        terminalreporter.section("figures")
        for text in texts:
            terminalreporter.write_line(text)
