"""The migrations build exactly the schema the code queries, on both drivers."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from forgeflow.store import Store
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
