"""A run's definition snapshot, parsed once.

A run keeps the definition it started with (editing the template never changes a run
under way), stored as JSON on the run row. That column is the largest of the row and
never changes, so it is parsed once per run and kept here, and the run row is locked
without it once it is.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from sqlalchemy import Connection

from forgeflow.pipelines.definition import PipelineDefinition
from forgeflow.store import pipelines as q
from forgeflow.store.pipelines import Row

# Units of work run on several database threads, hence the lock.
_DEFINITIONS: OrderedDict[str, PipelineDefinition] = OrderedDict()
_DEFINITIONS_LOCK = threading.Lock()


# Where :func:`lock` puts the parsed snapshot on a run row read without its definition.
_SNAPSHOT = "_definition"


def lock(conn: Connection, run_id: str) -> Row | None:
    """:func:`store.pipelines.lock_run`, without fetching and decoding the definition
    snapshot again when it is parsed already (it is the largest column of the row and
    it never changes)."""
    with _DEFINITIONS_LOCK:
        cached = _DEFINITIONS.get(run_id)
    run = q.lock_run(conn, run_id, definition=cached is None)
    if run is not None and cached is not None:
        run[_SNAPSHOT] = cached
    return run


def definition_of(run: Row) -> PipelineDefinition:
    """The run's own snapshot of its definition."""
    snapshot = run.get(_SNAPSHOT)
    if isinstance(snapshot, PipelineDefinition):
        return snapshot
    with _DEFINITIONS_LOCK:
        cached = _DEFINITIONS.get(run["run_id"])
    if cached is None:
        cached = PipelineDefinition.model_validate(run["definition"])
        with _DEFINITIONS_LOCK:
            _DEFINITIONS[run["run_id"]] = cached
            if len(_DEFINITIONS) > 1024:
                _DEFINITIONS.popitem(last=False)
    return cached


def definition_for(conn: Connection, run_id: str) -> PipelineDefinition | None:
    """A run's definition, reading the run row only when it is not cached yet."""
    with _DEFINITIONS_LOCK:
        cached = _DEFINITIONS.get(run_id)
    if cached is not None:
        return cached
    run = q.get_run(conn, run_id)
    return None if run is None else definition_of(run)
