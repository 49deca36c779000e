"""Compact pipeline definitions for tests: ``dag("t>a t>b a>j b>j", j="join")``."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from forgeflow.domain.pipeline_records import PipelineStep
from forgeflow.pipelines.definition import PipelineDefinition, load_definition

_DEFAULT_BODY = {"listen": "test.echo", "router": "pipeline.condition", "forEach": "test.echo"}


def dag_doc(edges: str, key: str = "p", **nodes: Any) -> dict[str, Any]:
    """A definition document. ``edges`` is ``a>b`` pairs (``r>x:key`` for a routeKey);
    node kinds default to trigger for ``t``/``t2``…, terminal for ``end*``, else listen.
    A keyword per node gives its kind (a string) or its whole spec (a dict)."""
    ids: list[str] = []
    edge_list = []
    for pair in edges.split():
        left, _, right = pair.partition(">")
        target, _, route = right.partition(":")
        edge: dict[str, Any] = {"from": left, "to": target}
        if route:
            edge["routeKey"] = route
        edge_list.append(edge)
        for n in (left, target):
            if n not in ids:
                ids.append(n)
    for n in nodes:
        if n not in ids:
            ids.append(n)
    specs = []
    for n in ids:
        given = nodes.get(n)
        spec: dict[str, Any] = dict(given) if isinstance(given, dict) else {}
        kind = given if isinstance(given, str) else spec.get("kind")
        if kind is None:
            kind = "trigger" if n == "t" or (n.startswith("t") and n[1:].isdigit()) else None
        if kind is None:
            kind = "terminal" if n.startswith("end") else "listen"
        spec["id"] = n
        spec["kind"] = kind
        if kind in _DEFAULT_BODY and "bodyKey" not in spec:
            spec["bodyKey"] = _DEFAULT_BODY[kind]
        if kind == "forEach":
            spec.setdefault("extras", {}).setdefault("iterableKey", "inputs.items")
        specs.append(spec)
    return {
        "key": key,
        "name": key,
        "enabled": True,
        "nodes": specs,
        "edges": edge_list,
        "triggers": [{"type": "manual"}],
    }


def dag(edges: str, **nodes: Any) -> PipelineDefinition:
    return load_definition(dag_doc(edges, **nodes)).definition


def fails_once() -> list[dict[str, Any]]:
    """Two ``pipeline.bashScript`` nodes: ``count`` writes how often it ran in the run
    (under ``counted``), then ``shaky`` fails the first time it runs in the run and
    succeeds after (its marker file lives in the run's own folder)."""
    return [
        {
            "id": "count",
            "kind": "listen",
            "bodyKey": "pipeline.bashScript",
            "outputKey": "counted",
            "extras": {"script": "echo x >> runs; wc -l < runs"},
        },
        {
            "id": "shaky",
            "kind": "listen",
            "bodyKey": "pipeline.bashScript",
            "outputKey": "shaky",
            "extras": {"script": "if [ -f seen ]; then echo fine; else touch seen; exit 3; fi"},
        },
    ]


_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def step_row(step_id: str, **fields: Any) -> PipelineStep:
    """A node's step row as the store reads it, pending unless ``fields`` say otherwise."""
    values: dict[str, Any] = {
        "run_id": "r",
        "step_id": step_id,
        "item_index": -1,
        "kind": "listen",
        "body_key": None,
        "status": "pending",
        "attempt": 0,
        "retry_base": 0,
        "next_attempt_at": None,
        "item": None,
        "input": None,
        "output": None,
        "routes": None,
        "suspend": None,
        "error_code": None,
        "error": None,
        "claimed_by": None,
        "lease_expires_at": None,
        "created_at": _EPOCH,
        "started_at": None,
        "suspended_at": None,
        "finished_at": None,
        "updated_at": _EPOCH,
        "version": 1,
    }
    return replace(PipelineStep(**values), **fields)
