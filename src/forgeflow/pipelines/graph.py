"""Structural checks of a definition's DAG. Pure."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from croniter import croniter  # type: ignore[import-untyped]

from forgeflow.domain.events import EVENT_TYPES, KNOWN_EVENT_TYPES
from forgeflow.pipelines.kinds import StepKind

if TYPE_CHECKING:
    from forgeflow.pipelines.definition import PipelineDefinition

_NEEDS_BODY = (StepKind.LISTEN, StepKind.ROUTER, StepKind.FOREACH)
# What starts a run: the four trigger types, and a parent run (flow.callPipeline).
START_TYPES = ("event", "schedule", "manual", "webhook", "pipeline")


def check(d: PipelineDefinition) -> list[str]:
    """Every structural error, each naming the node, edge or field."""
    errors: list[str] = []
    ids = [n.id for n in d.nodes]
    for node_id, n in Counter(ids).items():
        if n > 1:
            errors.append(f"nodes[{node_id}]: duplicate id")
    known = set(ids)
    kinds = {n.id: n.kind for n in d.nodes}
    errors.extend(_check_nodes(d))
    errors.extend(_check_edges(d, known, kinds))
    if not any(n.kind is StepKind.TRIGGER for n in d.nodes):
        errors.append("nodes: no trigger node; a pipeline starts at a trigger node")
    targets = {e.to for e in d.edges}
    for node in d.nodes:
        if node.kind is not StepKind.TRIGGER and node.id not in targets:
            errors.append(f"nodes[{node.id}]: no incoming edge; it could never run")
    if not errors:
        cycle = find_cycle(ids, [(e.source, e.to) for e in d.edges])
        if cycle:
            errors.append("edges: cycle " + " -> ".join(cycle))
    errors.extend(_check_triggers(d))
    names = Counter(i.name for i in d.inputs)
    errors.extend(f"inputs[{name}]: duplicate name" for name, n in names.items() if n > 1)
    return errors


def _check_nodes(d: PipelineDefinition) -> list[str]:
    errors = []
    for node in d.nodes:
        where = f"nodes[{node.id}]"
        if node.kind is StepKind.TERMINAL and node.bodyKey:
            errors.append(f"{where}.bodyKey: a terminal node has no body")
        if node.kind in _NEEDS_BODY and not node.bodyKey:
            errors.append(f"{where}.bodyKey: required for a {node.kind.value} node")
        if node.kind is StepKind.FOREACH:
            if not isinstance(node.extras.get("iterableKey"), str):
                errors.append(f"{where}.extras.iterableKey: required for a forEach node")
            bound = node.extras.get("maxConcurrency")
            if bound is not None and (
                isinstance(bound, bool) or not isinstance(bound, int) or bound < 1
            ):
                errors.append(f"{where}.extras.maxConcurrency: must be a positive integer")
        if node.kind is StepKind.TRIGGER:
            ttype = node.extras.get("triggerType")
            if ttype is not None and ttype not in START_TYPES:
                errors.append(
                    f"{where}.extras.triggerType: must be one of {', '.join(START_TYPES)}"
                )
        timeout = node.extras.get("timeoutSeconds")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
        ):
            errors.append(f"{where}.extras.timeoutSeconds: must be a positive number")
    return errors


def _check_edges(d: PipelineDefinition, known: set[str], kinds: dict[str, StepKind]) -> list[str]:
    errors = []
    seen: set[tuple[str, str, str | None]] = set()
    for i, e in enumerate(d.edges):
        where = f"edges[{i}]"
        bad = False
        for field, ref in (("from", e.source), ("to", e.to)):
            if ref not in known:
                errors.append(f"{where}.{field}: unknown node {ref!r}")
                bad = True
        if bad:
            continue
        key = (e.source, e.to, e.routeKey)
        if key in seen:
            errors.append(f"{where}: duplicate edge {e.source} -> {e.to}")
        seen.add(key)
        if e.source == e.to:
            errors.append(f"{where}: an edge from {e.source!r} to itself is a cycle")
        if kinds[e.to] is StepKind.TRIGGER:
            errors.append(f"{where}.to: a trigger node ({e.to}) has no incoming edges")
        if kinds[e.source] is StepKind.TERMINAL:
            errors.append(f"{where}.from: a terminal node ({e.source}) has no outgoing edges")
        if e.routeKey is not None and kinds[e.source] is not StepKind.ROUTER:
            errors.append(f"{where}.routeKey: only edges leaving a router carry a routeKey")
    return errors


def _check_triggers(d: PipelineDefinition) -> list[str]:
    errors = []
    seen: set[tuple[str, str]] = set()
    for i, t in enumerate(d.triggers):
        where = f"triggers[{i}]"
        if t.type == "event" and not t.eventType:
            errors.append(f"{where}.eventType: required for an event trigger")
        if t.type != "event" and t.eventType:
            errors.append(f"{where}.eventType: only an event trigger has an eventType")
        if t.type == "event" and t.eventType and t.eventType not in KNOWN_EVENT_TYPES:
            errors.append(
                f"{where}.eventType: {t.eventType!r} is not a domain event "
                f"(one of {', '.join(EVENT_TYPES)})"
            )
        if t.type == "schedule":
            if not t.schedule:
                errors.append(f"{where}.schedule: required for a schedule trigger")
            elif not valid_schedule(t.schedule):
                errors.append(f"{where}.schedule: must be 'every:<seconds>' or a cron expression")
        key = (t.type, t.eventType or "")
        if key in seen:
            errors.append(f"{where}: a template has at most one {t.type} trigger per event type")
        seen.add(key)
    return errors


def valid_schedule(schedule: str) -> bool:
    if schedule.startswith("every:"):
        rest = schedule.removeprefix("every:")
        return rest.isdigit() and int(rest) > 0
    return bool(croniter.is_valid(schedule))


def find_cycle(nodes: list[str], edges: list[tuple[str, str]]) -> list[str] | None:
    """One cycle as a path that ends where it starts, or None (iterative DFS)."""
    out: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in edges:
        out.setdefault(a, []).append(b)
    color: dict[str, int] = dict.fromkeys(out, 0)
    for root in out:
        if color[root]:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path: list[str] = [root]
        color[root] = 1
        while stack:
            node, i = stack[-1]
            if i < len(out[node]):
                stack[-1] = (node, i + 1)
                nxt = out[node][i]
                if color.get(nxt, 0) == 1:
                    return [*path[path.index(nxt) :], nxt]
                if color.get(nxt, 0) == 0:
                    color[nxt] = 1
                    stack.append((nxt, 0))
                    path.append(nxt)
            else:
                color[node] = 2
                stack.pop()
                path.pop()
    return None
