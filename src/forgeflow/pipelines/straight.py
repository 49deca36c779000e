"""A step's success on the straight path of a run, in one transaction of few statements.

What :func:`steps.succeed` then :func:`runs.advance` then :func:`steps.claim_ready` do,
for the common case, with what is known in memory instead of read back:

- the run row as the step's claim left it: when the run has not moved since, a
  compare-and-swap on its version records the new state (and takes the run row's
  lock, first, as every move of a run does) without reading it again;
- the step row as it was claimed: its compare-and-swap records the success;
- the definition's graph (it never changes within a run): only the finished node's
  successors are planned (:func:`planner.plan_success`), reading at most which of
  their other upstream nodes are still open;
- the successors that became runnable are claimed in the same statement that
  releases them, within the run's limits.

Whatever this path cannot answer so — a forEach item, a router whose choice killed a
branch, a node with no successor, a terminal reached, a forEach to expand, a reducer
error — goes through the full units of work, which stay the reference.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from forgeflow.pipelines import runs
from forgeflow.pipelines import state as bag
from forgeflow.pipelines.definition import NodeSpec
from forgeflow.pipelines.kinds import NODE_ROW, RunStatus, StepKind
from forgeflow.pipelines.planner import graph_of, live_successors, plan_success, waiting_on
from forgeflow.pipelines.registry import Done
from forgeflow.pipelines.steps import Claimed, claim_ready, succeed
from forgeflow.redaction import redact
from forgeflow.store import pipeline_moves as moves
from forgeflow.store.pipelines import Row
from forgeflow.store.types import utcnow

Outcome = tuple[Row | None, list[Claimed], bool]


class Moved(Exception):
    """The step moved on while its body ran (cancelled, recovered, decided): the
    transaction is rolled back and the result dropped, as :func:`steps.succeed` drops
    it."""


def succeed_and_claim(
    conn: Connection,
    seen: Row,
    done: Done,
    *,
    input_snapshot: Any = None,
    owner: str,
    ttl: timedelta,
    limit: int,
    known: Row | None = None,
) -> Outcome:
    """Record a step's success, plan what follows and claim (up to ``limit``) what
    became runnable, in the caller's transaction: (run, claims, steps left for the
    claim round). ``known``: the run row as the step's claim saw it.

    Raises :class:`Moved` when the step is no longer as ``seen``.
    """
    if seen["item_index"] == NODE_ROW:
        fast = _succeed_node(conn, seen, done, input_snapshot, owner, ttl, limit, known)
        if fast is not None:
            return fast
    run = succeed(conn, seen, done, input_snapshot=input_snapshot)
    if run is None or limit <= 0:
        return run, [], True
    claimed, left = claim_ready(conn, run, owner=owner, ttl=ttl, limit=limit)
    return run, claimed, left


def _succeed_node(
    conn: Connection,
    seen: Row,
    done: Done,
    input_snapshot: Any,
    owner: str,
    ttl: timedelta,
    limit: int,
    known: Row | None,
) -> Outcome | None:
    """The straight path of a node row; None, before writing anything, when the full
    units of work must take it (they also drop a result for a run that ended)."""
    output = redact(done.output)
    now = utcnow()
    try:
        run = _record_run(conn, known, seen, done, output, now) if known is not None else None
        if run is None:
            locked = runs.lock(conn, seen["run_id"])
            if locked is None or locked["status"] != RunStatus.RUNNING:
                return None
            run = _record_run(conn, locked, seen, done, output, now)
            if run is None:
                return None  # cannot happen under the lock; the full path decides
    except bag.ReducerError:
        return None  # the full path fails the node with reducer_error
    node = _node(run, seen)
    routes = list(done.routes) if done.routes is not None and node.kind is StepKind.ROUTER else None
    snapshot = None if input_snapshot is None else redact(input_snapshot)
    if not moves.succeed_step(conn, seen, output=output, routes=routes, input=snapshot, now=now):
        raise Moved(f"step {seen['run_id']}/{seen['step_id']} moved on")
    g = graph_of(runs.definition_of(run))
    successors = live_successors(g, node.id, frozenset(routes or ()))
    if successors is not None:
        others = waiting_on(g, node.id, successors)
        still_open = moves.open_nodes(conn, run["run_id"]) if others else set()
        p = plan_success(g, node.id, successors, still_open)
        if not p.reached and all(g.nodes[s].kind is not StepKind.FOREACH for s in p.ready):
            claimed, left, consistent = _release(conn, run, p.ready, owner, ttl, limit, now)
            if consistent:
                return run, claimed, left
            return _full(conn, run, owner, ttl, limit, claimed)
    return _full(conn, run, owner, ttl, limit, [])


def _node(run: Row, seen: Row) -> NodeSpec:
    return graph_of(runs.definition_of(run)).nodes[seen["step_id"]]


def _record_run(
    conn: Connection, run: Row, seen: Row, done: Done, output: Any, now: datetime
) -> Row | None:
    """The run's compare-and-swap with the step's output reduced into its state (the
    bag is written only when it changed); None when the run moved on."""
    state = runs.write_output(run, _node(run, seen), output)
    changes: dict[str, Any] = {
        "input_tokens": run["input_tokens"] + done.input_tokens,
        "output_tokens": run["output_tokens"] + done.output_tokens,
        "cost": run["cost"] + done.cost,
    }
    if state is not run["state"]:
        changes["state"] = state
    return moves.bump_run(conn, run, now=now, **changes)


def _release(
    conn: Connection,
    run: Row,
    ready: tuple[str, ...],
    owner: str,
    ttl: timedelta,
    limit: int,
    now: datetime,
) -> tuple[list[Claimed], bool, bool]:
    """Claim the nodes that became runnable, within ``limit`` and the run's limits;
    the rest become runnable for the claim round. (claims, left for the round,
    consistent: False when a node was not pending as the plan assumed)."""
    config = runs.definition_of(run).config
    claimed: list[Claimed] = []
    left = False
    for step_id in ready:
        row = None
        if len(claimed) < limit:
            row = moves.claim_pending(
                conn,
                run["run_id"],
                step_id,
                owner=owner,
                lease=now + ttl,
                now=now,
                max_concurrent=config.maxConcurrentSteps,
                max_steps=config.maxSteps,
            )
        if row is not None:
            claimed.append(Claimed(row, run))
        elif moves.mark_runnable(conn, run["run_id"], step_id, now=now):
            left = True
        else:
            return claimed, left, False
    return claimed, left, True


def _full(
    conn: Connection, run: Row, owner: str, ttl: timedelta, limit: int, claimed: list[Claimed]
) -> Outcome:
    """The reference planner and claim, after the success was recorded."""
    after = runs.advance(conn, run["run_id"], locked=run)
    if after is None or limit - len(claimed) <= 0:
        return after, claimed, True
    more, left = claim_ready(conn, after, owner=owner, ttl=ttl, limit=limit - len(claimed))
    return after, claimed + more, left
