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

from forgeflow.domain.json import JsonObject
from forgeflow.domain.pipeline_records import PipelineRun
from forgeflow.pipelines.definition import PipelineDefinition
from forgeflow.store import pipelines as q

# Units of work run on several database threads, hence the lock. Each run's snapshot
# is kept as stored (to lock the row without reading it again) and parsed.
_DEFINITIONS: OrderedDict[str, tuple[JsonObject, PipelineDefinition]] = OrderedDict()
_DEFINITIONS_LOCK = threading.Lock()


def _cached(run_id: str) -> tuple[JsonObject, PipelineDefinition] | None:
    with _DEFINITIONS_LOCK:
        return _DEFINITIONS.get(run_id)


def lock(conn: Connection, run_id: str) -> PipelineRun | None:
    """:func:`store.pipelines.lock_run`, without fetching and decoding the definition
    snapshot again when it is parsed already (it is the largest column of the row and
    it never changes)."""
    cached = _cached(run_id)
    return q.lock_run(conn, run_id, definition=None if cached is None else cached[0])


def definition_of(run: PipelineRun) -> PipelineDefinition:
    """The run's own snapshot of its definition."""
    cached = _cached(run.run_id)
    if cached is not None:
        return cached[1]
    parsed = PipelineDefinition.model_validate(run.definition)
    with _DEFINITIONS_LOCK:
        _DEFINITIONS[run.run_id] = (run.definition, parsed)
        if len(_DEFINITIONS) > 1024:
            _DEFINITIONS.popitem(last=False)
    return parsed


def definition_for(conn: Connection, run_id: str) -> PipelineDefinition | None:
    """A run's definition, reading the run row only when it is not cached yet."""
    cached = _cached(run_id)
    if cached is not None:
        return cached[1]
    run = q.get_run(conn, run_id)
    return None if run is None else definition_of(run)
