"""The migrations build exactly the schema the code queries, on both drivers."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text

from forgeflow.store import Store, migrate
from forgeflow.store.schema import metadata


def test_migrations_match_the_schema(store: Store) -> None:
    with store.db.writer.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    assert diff == []
    assert store.is_current()


def test_migrate_is_idempotent(store: Store) -> None:
    store.migrate()
    store.migrate()
    assert store.is_current()


def test_one_active_task_per_repository_is_a_database_index(store: Store) -> None:
    indexes = inspect(store.db.writer).get_indexes("tasks")
    active = next(i for i in indexes if i["name"] == "ux_tasks_one_active_per_repo")
    assert active["unique"] and active["column_names"] == ["repo_key"]


def test_the_file_names_give_alembics_head() -> None:
    # serve skips Alembic when the database is at shipped_head(): the two must agree.
    assert migrate.shipped_head() == migrate.head_revision()


def test_a_database_behind_the_code_is_not_current(store: Store) -> None:
    with store.db.writer.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0001'"))
    assert not store.is_current()
