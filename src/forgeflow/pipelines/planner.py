"""DAG planning: which steps become runnable or skipped, and when a run ends. Pure.

Edges are *live* (the source is done — succeeded, or failed with ``continueOnFail`` —
and, out of a router, its routeKey was chosen), *dead* (the source was skipped or
cancelled, a router chose another key, or the source is a trigger node that did not
start this run) or *pending*. Then, per kind:

- ``trigger``: the start node chosen for the run's trigger runs; every other trigger
  node is skipped, so edges leaving it are dead for that run.
- ``listen``, ``router``, ``forEach``, ``terminal``: runnable once no incoming edge is
  pending and at least one is live; skipped once every incoming edge is dead. Dead
  branches never block a node that a live branch also reaches.
- ``join``: runnable once every incoming edge is settled (live or dead); a join is
  never skipped by propagation — skipped branches only stop blocking it.
- ``forEach``: once runnable it is expanded into items (by the engine); the planner then
  releases pending items in order while fewer than ``extras.maxConcurrency`` are
  active, and settles the node when every item succeeded (or one failed).
- ``terminal``: has no body; reaching one ends the run successfully.

A run also ends when nothing is open any more (succeeded), or when a step failed
without ``continueOnFail`` (failed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from forgeflow.pipelines.definition import NodeSpec, PipelineDefinition
from forgeflow.pipelines.kinds import OPEN_STEP_STATUSES, RunStatus, StepKind, StepStatus

S = StepStatus
_ACTIVE_ITEM = frozenset({S.RUNNABLE, S.RUNNING, S.SUSPENDED})


class Edge(Enum):
    LIVE = "live"
    DEAD = "dead"
    PENDING = "pending"


@dataclass(frozen=True, slots=True)
class NodeState:
    """What the planner needs to know of one node's row (and its items)."""

    status: StepStatus = S.PENDING
    routes: frozenset[str] = frozenset()
    items: tuple[StepStatus, ...] | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    ready: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    items_ready: tuple[tuple[str, int], ...] = ()
    foreach_done: tuple[tuple[str, bool], ...] = ()
    reached: tuple[str, ...] = ()
    outcome: RunStatus | None = None
    failed: tuple[str, ...] = field(default=())

    @property
    def empty(self) -> bool:
        return not (
            self.ready or self.skip or self.items_ready or self.foreach_done or self.reached
        )


def start_node(d: PipelineDefinition, trigger_type: str, event_type: str | None) -> str | None:
    """The trigger node a run starts at: its ``extras.eventType`` matches the run's event,
    else its ``extras.triggerType`` matches the run's trigger, else it declares neither."""
    triggers = [n for n in d.nodes if n.kind is StepKind.TRIGGER]
    if event_type:
        for n in triggers:
            if n.extras.get("eventType") == event_type:
                return n.id
    for n in triggers:
        if n.extras.get("triggerType") == trigger_type and not n.extras.get("eventType"):
            return n.id
    for n in triggers:
        if not n.extras.get("triggerType") and not n.extras.get("eventType"):
            return n.id
    return None


Incoming = Mapping[str, tuple[tuple[str, str | None], ...]]


def _edge(source: NodeSpec, st: NodeState, route: str | None) -> Edge:
    """The state of an edge out of ``source`` (whose row is ``st``), taken when the
    source chose ``route`` (None: an edge that is not a router's branch)."""
    if st.status in (S.SKIPPED, S.CANCELLED):
        return Edge.DEAD
    if st.status is S.SUCCEEDED or (st.status is S.FAILED and source.continueOnFail):
        return Edge.LIVE if route is None or route in st.routes else Edge.DEAD
    if st.status is S.FAILED:
        return Edge.DEAD
    return Edge.PENDING


def plan(d: PipelineDefinition, start: str, states: Mapping[str, NodeState]) -> Plan:
    """Decide the next transitions from the current node states (missing = pending)."""
    status = {n.id: states.get(n.id, NodeState()) for n in d.nodes}
    failed = tuple(
        n.id for n in d.nodes if status[n.id].status is S.FAILED and not n.continueOnFail
    )
    if failed:
        return Plan(outcome=RunStatus.FAILED, failed=failed)
    incoming = d.incoming
    skip = _skip(d, start, status, incoming)
    ready, reached = _released(d, start, status, incoming)
    items_ready, foreach_done = _foreach(d, status)
    terminal_done = any(
        n.kind is StepKind.TERMINAL and status[n.id].status is S.SUCCEEDED for n in d.nodes
    )
    quiet = not (ready or items_ready or foreach_done) and not any(
        status[n.id].status in OPEN_STEP_STATUSES for n in d.nodes
    )
    return Plan(
        ready=ready,
        skip=skip,
        items_ready=items_ready,
        foreach_done=foreach_done,
        reached=reached,
        outcome=RunStatus.SUCCEEDED if reached or terminal_done or quiet else None,
    )


def _skip(
    d: PipelineDefinition, start: str, status: dict[str, NodeState], incoming: Incoming
) -> tuple[str, ...]:
    """The pending nodes no live branch can reach any more, taken to the fixpoint (each
    skip may kill the edges out of it); ``status`` is updated to match."""
    nodes = d.by_id
    skip: list[str] = []
    changed = True
    while changed:
        changed = False
        for n in d.nodes:
            if status[n.id].status is not S.PENDING:
                continue
            if n.kind is StepKind.TRIGGER:
                dead = n.id != start
            elif n.kind is StepKind.JOIN:
                dead = False
            else:
                dead = all(_edge(nodes[s], status[s], r) is Edge.DEAD for s, r in incoming[n.id])
            if dead:
                skip.append(n.id)
                status[n.id] = NodeState(S.SKIPPED)
                changed = True
    return tuple(skip)


def _released(
    d: PipelineDefinition, start: str, status: Mapping[str, NodeState], incoming: Incoming
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The pending nodes that may run now, and the terminals reached."""
    nodes = d.by_id
    ready: list[str] = []
    reached: list[str] = []
    for n in d.nodes:
        if status[n.id].status is not S.PENDING:
            continue
        if n.kind is StepKind.TRIGGER:
            is_ready = n.id == start
        else:
            edges = [_edge(nodes[s], status[s], r) for s, r in incoming[n.id]]
            settled = Edge.PENDING not in edges
            is_ready = settled and (n.kind is StepKind.JOIN or Edge.LIVE in edges)
        if is_ready:
            (reached if n.kind is StepKind.TERMINAL else ready).append(n.id)
    return tuple(ready), tuple(reached)


def _foreach(
    d: PipelineDefinition, status: Mapping[str, NodeState]
) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, bool], ...]]:
    items_ready: list[tuple[str, int]] = []
    done: list[tuple[str, bool]] = []
    for n in d.nodes:
        st = status[n.id]
        if n.kind is not StepKind.FOREACH or st.status is not S.RUNNING or st.items is None:
            continue
        items = st.items
        if any(s is S.FAILED for s in items):
            done.append((n.id, False))
            continue
        if all(s is S.SUCCEEDED for s in items):
            done.append((n.id, True))
            continue
        if all(s not in OPEN_STEP_STATUSES for s in items):
            done.append((n.id, False))
            continue
        bound = n.extras.get("maxConcurrency")
        limit = bound if isinstance(bound, int) and bound > 0 else len(items)
        active = sum(1 for s in items if s in _ACTIVE_ITEM)
        for index, s in enumerate(items):
            if active >= limit:
                break
            if s is S.PENDING:
                items_ready.append((n.id, index))
                active += 1
    return tuple(items_ready), tuple(done)


def has_slot(limit: int, running: int) -> bool:
    """Whether one more step of the run may start under its ``maxConcurrentSteps``."""
    return running < limit


def over_budget(max_steps: int, executed: int) -> bool:
    """True when starting one more execution would exceed the run's ``maxSteps``."""
    return executed >= max_steps
