"""Random DAGs driven to the end through the planner, with random outcomes.

Properties: every run terminates; a join never fires before each of its upstream
steps settled; a non-join step fires only with a live upstream; no step or item runs
twice unless it was retried; a run that succeeded has no unforgiven failure.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forgeflow.pipelines.definition import PipelineDefinition, load_definition
from forgeflow.pipelines.kinds import OPEN_STEP_STATUSES, RunStatus, StepKind, StepStatus
from forgeflow.pipelines.planner import NodeState, plan

S = StepStatus
SETTLED = {S.SUCCEEDED, S.FAILED, S.SKIPPED, S.CANCELLED}
KINDS = ["listen", "listen", "join", "router", "forEach", "terminal"]
BODY = {"listen": "x", "join": None, "router": "x", "forEach": "x", "terminal": None}


@st.composite
def dags(draw: st.DrawFn) -> PipelineDefinition:
    n_triggers = draw(st.integers(1, 2))
    n_nodes = draw(st.integers(1, 9))
    nodes: list[dict[str, Any]] = [{"id": f"t{i}", "kind": "trigger"} for i in range(n_triggers)]
    edges: list[dict[str, Any]] = []
    sources = [n["id"] for n in nodes]
    for i in range(n_nodes):
        kind = draw(st.sampled_from(KINDS))
        node: dict[str, Any] = {"id": f"n{i}", "kind": kind}
        if BODY[kind]:
            node["bodyKey"] = BODY[kind]
        if kind == "forEach":
            node["extras"] = {"iterableKey": "xs", "maxConcurrency": draw(st.integers(1, 3))}
        node["continueOnFail"] = draw(st.booleans())
        chosen = draw(st.lists(st.sampled_from(sources), min_size=1, max_size=3, unique=True))
        for src in chosen:
            edge: dict[str, Any] = {"from": src, "to": node["id"]}
            src_kind = next(x["kind"] for x in nodes if x["id"] == src)
            if src_kind == "router":
                route = draw(st.sampled_from(["a", "b", None]))
                if route:
                    edge["routeKey"] = route
            edges.append(edge)
        nodes.append(node)
        if kind != "terminal":
            sources.append(node["id"])
    doc = {"key": "h", "name": "h", "nodes": nodes, "edges": edges}
    return load_definition(doc).definition


class Sim:
    """An in-memory engine: applies plans like ``runs.advance`` and runs steps."""

    def __init__(self, d: PipelineDefinition, data: st.DataObject, start: str) -> None:
        self.d = d
        self.start = start
        self.data = data
        self.status: dict[str, S] = {n.id: S.PENDING for n in d.nodes}
        self.routes: dict[str, frozenset[str]] = {}
        self.items: dict[str, list[S]] = {}
        self.runs: Counter[tuple[str, int]] = Counter()
        self.retries: Counter[tuple[str, int]] = Counter()
        self.incoming = {n.id: [e.source for e in d.edges if e.to == n.id] for n in d.nodes}

    def node_states(self) -> dict[str, NodeState]:
        out = {}
        for n in self.d.nodes:
            items = None
            if n.kind is StepKind.FOREACH and self.status[n.id] is S.RUNNING:
                items = tuple(self.items[n.id])
            out[n.id] = NodeState(self.status[n.id], self.routes.get(n.id, frozenset()), items)
        return out

    def check_ready(self, node_id: str) -> None:
        node = self.d.node(node_id)
        ups = self.incoming[node_id]
        assert all(self.status[u] in SETTLED for u in ups), f"{node_id} fired early"
        if node.kind is not StepKind.JOIN and node.kind is not StepKind.TRIGGER:
            assert any(self.status[u] in (S.SUCCEEDED, S.FAILED) for u in ups)

    def apply(self, p: Any) -> None:
        for sid in p.skip:
            assert self.status[sid] is S.PENDING
            self.status[sid] = S.SKIPPED
        for sid in p.reached:
            self.check_ready(sid)
            self.status[sid] = S.SUCCEEDED
        for sid in p.ready:
            self.check_ready(sid)
            assert self.status[sid] is S.PENDING, f"{sid} made ready twice"
            if self.d.node(sid).kind is StepKind.FOREACH:
                count = self.data.draw(st.integers(0, 4))
                self.items[sid] = [S.PENDING] * count
                self.status[sid] = S.RUNNING if count else S.SUCCEEDED
            else:
                self.status[sid] = S.RUNNABLE
        for sid, index in p.items_ready:
            assert self.items[sid][index] is S.PENDING
            self.items[sid][index] = S.RUNNABLE
        for sid, ok in p.foreach_done:
            self.status[sid] = S.SUCCEEDED if ok else S.FAILED
            self.items[sid] = [S.SKIPPED if s in OPEN_STEP_STATUSES else s for s in self.items[sid]]
        for sid, items in self.items.items():
            bound = self.d.node(sid).extras["maxConcurrency"]
            active = sum(1 for s in items if s in (S.RUNNABLE, S.RUNNING, S.SUSPENDED))
            assert active <= bound

    def work(self) -> list[tuple[str, int]]:
        out = [(n, -1) for n, s in self.status.items() if s in (S.RUNNABLE, S.RUNNING)]
        for sid, items in self.items.items():
            if self.status[sid] is S.RUNNING:
                out += [(sid, i) for i, s in enumerate(items) if s in (S.RUNNABLE, S.RUNNING)]
        return out

    def get(self, key: tuple[str, int]) -> S:
        return self.status[key[0]] if key[1] < 0 else self.items[key[0]][key[1]]

    def put(self, key: tuple[str, int], value: S) -> None:
        if key[1] < 0:
            self.status[key[0]] = value
        else:
            self.items[key[0]][key[1]] = value

    def step(self) -> None:
        work = self.work()
        assert work, f"stuck: {self.status} {self.items}"
        key = self.data.draw(st.sampled_from(sorted(work)))
        if self.get(key) is S.RUNNABLE:
            assert self.runs[key] <= self.retries[key], f"{key} ran twice without a retry"
            self.runs[key] += 1
            self.put(key, S.RUNNING)
            return
        outcome = self.data.draw(st.sampled_from(["ok", "ok", "ok", "retry", "fail"]))
        if outcome == "retry" and self.retries[key] < 2:
            self.retries[key] += 1
            self.put(key, S.RUNNABLE)
        elif outcome == "fail":
            self.put(key, S.FAILED)
        else:
            self.put(key, S.SUCCEEDED)
            if key[1] < 0 and self.d.node(key[0]).kind is StepKind.ROUTER:
                chosen = self.data.draw(st.sets(st.sampled_from(["a", "b", "c"]), max_size=2))
                self.routes[key[0]] = frozenset(chosen)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=dags(), data=st.data())
def test_random_dags_terminate_and_keep_their_promises(
    d: PipelineDefinition, data: st.DataObject
) -> None:
    triggers = [n.id for n in d.nodes if n.kind is StepKind.TRIGGER]
    start = data.draw(st.sampled_from(triggers))
    sim = Sim(d, data, start)
    outcome = None
    for _ in range(2000):
        p = plan(d, start, sim.node_states())
        sim.apply(p)
        if p.outcome is not None:
            outcome = p.outcome
            break
        if p.empty:
            sim.step()
    assert outcome is not None, "the run did not terminate"
    unforgiven = [n.id for n in d.nodes if sim.status[n.id] is S.FAILED and not n.continueOnFail]
    if outcome is RunStatus.SUCCEEDED:
        assert not unforgiven
    else:
        assert unforgiven
    assert sim.status[start] is not S.SKIPPED
    for other in triggers:
        if other != start:
            assert sim.status[other] is S.SKIPPED
