"""The SQL that names task states is derived from domain/states.py's sets, and the
migrations' frozen copy of it still says the same."""

from __future__ import annotations

import importlib

from forgeflow.domain.states import ACTIVE_STATES, TaskState
from forgeflow.store.schema import ACTIVE_STATES_SQL, state_in


def test_the_active_states_sql_is_the_active_set_in_the_tables_order() -> None:
    assert ACTIVE_STATES_SQL == "state IN ('preparing', 'running', 'aborting')"
    assert state_in(frozenset({TaskState.QUEUED, TaskState.RECEIVED})) == (
        "state IN ('received', 'queued')"
    )
    assert {TaskState(v.strip("' ")) for v in ACTIVE_STATES_SQL[10:-1].split(",")} == (
        ACTIVE_STATES
    )


def test_the_first_migration_indexes_the_same_active_states() -> None:
    initial = importlib.import_module("forgeflow.store.migrations.versions.0001_initial")
    assert initial._ACTIVE.text == ACTIVE_STATES_SQL
