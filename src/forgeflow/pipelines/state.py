"""The run's state bag: reducers that merge writes, and path look-ups. Pure.

Steps never call each other: they read inputs from the bag and write their output
back under their ``outputKey``. When parallel branches write the same key, the key's
:class:`StateReducer` decides how the values combine; the engine applies it in the same
transaction that records the step's completion, so no write is lost.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from forgeflow.domain.json import JsonObject
from forgeflow.pipelines.kinds import STEP_ERRORS_KEY


class StateReducer(StrEnum):
    OVERRIDE = "override"
    APPEND = "append"
    MERGE_LISTS = "mergeLists"
    MERGE_MAPS = "mergeMaps"
    SUM = "sum"


class ReducerError(ValueError):
    code = "reducer_error"


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def reduce(reducer: StateReducer, existing: Any, incoming: Any) -> Any:
    """Combine the value already under a key with a new write.

    - ``override``: the new value wins.
    - ``append``: the key holds a list; a scalar is added to it, a list extends it
      (the first write of a scalar becomes a one-item list).
    - ``mergeLists``: concatenation, scalars taken as one-item lists.
    - ``mergeMaps``: shallow merge, the new keys win; both sides must be mappings.
    - ``sum``: numeric addition; both sides must be numbers.
    """
    if existing is MISSING or existing is None:
        if reducer is StateReducer.APPEND:
            return list(incoming) if isinstance(incoming, list) else [incoming]
        if reducer is StateReducer.MERGE_MAPS and not isinstance(incoming, Mapping):
            raise ReducerError(f"mergeMaps needs a mapping, got {type(incoming).__name__}")
        if reducer is StateReducer.SUM and not _number(incoming):
            raise ReducerError(f"sum needs a number, got {type(incoming).__name__}")
        return incoming
    if reducer is StateReducer.OVERRIDE:
        return incoming
    if reducer is StateReducer.APPEND:
        base = list(existing) if isinstance(existing, list) else [existing]
        return base + (list(incoming) if isinstance(incoming, list) else [incoming])
    if reducer is StateReducer.MERGE_LISTS:
        left = list(existing) if isinstance(existing, list) else [existing]
        return left + (list(incoming) if isinstance(incoming, list) else [incoming])
    if reducer is StateReducer.MERGE_MAPS:
        if not isinstance(existing, Mapping) or not isinstance(incoming, Mapping):
            raise ReducerError("mergeMaps needs a mapping on both sides")
        return {**existing, **incoming}
    if not _number(existing) or not _number(incoming):
        raise ReducerError("sum needs numbers on both sides")
    return existing + incoming


def write(state: Mapping[str, Any], key: str, value: Any, reducer: StateReducer) -> JsonObject:
    """A new bag with ``value`` reduced into ``key`` (the input is not modified)."""
    out = dict(state)
    out[key] = reduce(reducer, out.get(key, MISSING), copy.deepcopy(value))
    return out


def record_error(state: Mapping[str, Any], step_id: str, error: str) -> JsonObject:
    """Keep a continued-on-fail step's error under ``_stepErrors.<step>``."""
    out = dict(state)
    errors = dict(out.get(STEP_ERRORS_KEY) or {})
    errors[step_id] = error
    out[STEP_ERRORS_KEY] = errors
    return out


def lookup(state: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path (``triage.label``, ``items.0``), or MISSING."""
    current: Any = state
    for part in path.split("."):
        if isinstance(current, Mapping) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.lstrip("-").isdigit():
            index = int(part)
            if not -len(current) <= index < len(current):
                return MISSING
            current = current[index]
        else:
            return MISSING
    return current
