"""The planner, table-driven: which steps become runnable or skipped, and run ends."""

from __future__ import annotations

from typing import Any

import pytest

from forgeflow.pipelines.kinds import RunStatus, StepStatus
from forgeflow.pipelines.planner import NodeState, Plan, has_slot, over_budget, plan, start_node
from tests.support.pipelines import dag

S = StepStatus


def states(**given: Any) -> dict[str, NodeState]:
    """``a="succeeded"``, ``r=("succeeded", {"x"})`` (routes), ``f=("running", [items])``."""
    out = {}
    for node, value in given.items():
        if isinstance(value, str):
            out[node] = NodeState(S(value))
        elif isinstance(value[1], set):
            out[node] = NodeState(S(value[0]), frozenset(value[1]))
        else:
            out[node] = NodeState(S(value[0]), items=tuple(S(x) for x in value[1]))
    return out


LINEAR = dag("t>a a>b b>end")
PARALLEL = dag("t>a t>b a>j b>j j>end", j="join")
ROUTER = dag("t>r r>x:yes r>y:no x>x2 y>y2 x2>m y2>m m>end", r="router")
JOIN_AFTER_ROUTER = dag("t>r r>x:yes r>y:no x>j y>j j>end", r="router", j="join")
TWO_STARTS = dag(
    "t>manual_only t2>both t>both manual_only>end both>end",
    t={"kind": "trigger", "extras": {"triggerType": "manual"}},
    t2={"kind": "trigger", "extras": {"triggerType": "schedule"}},
)
CONTINUE = dag("t>a a>b b>end", a={"kind": "listen", "bodyKey": "x", "continueOnFail": True})
FOREACH = dag(
    "t>f f>end",
    f={"kind": "forEach", "bodyKey": "x", "extras": {"iterableKey": "xs", "maxConcurrency": 2}},
)


@pytest.mark.parametrize(
    ("name", "definition", "start", "given", "expected"),
    [
        # happy path
        ("fresh run: only the start node", LINEAR, "t", {}, Plan(ready=("t",))),
        ("start running: nothing yet", LINEAR, "t", states(t="running"), Plan()),
        ("trigger done", LINEAR, "t", states(t="succeeded"), Plan(ready=("a",))),
        (
            "last step done: terminal reached",
            LINEAR,
            "t",
            states(t="succeeded", a="succeeded", b="succeeded"),
            Plan(reached=("end",), outcome=RunStatus.SUCCEEDED),
        ),
        # parallel + join
        ("fan out", PARALLEL, "t", states(t="succeeded"), Plan(ready=("a", "b"))),
        (
            "join waits for the running branch",
            PARALLEL,
            "t",
            states(t="succeeded", a="succeeded", b="running"),
            Plan(),
        ),
        (
            "join fires once both are done",
            PARALLEL,
            "t",
            states(t="succeeded", a="succeeded", b="succeeded"),
            Plan(ready=("j",)),
        ),
        # router
        (
            "router: the other branch is skipped transitively, the merge point is not",
            ROUTER,
            "t",
            states(t="succeeded", r=("succeeded", {"yes"})),
            Plan(ready=("x",), skip=("y", "y2")),
        ),
        (
            "merge point runs once the live branch is done",
            ROUTER,
            "t",
            states(
                t="succeeded",
                r=("succeeded", {"yes"}),
                x="succeeded",
                x2="succeeded",
                y="skipped",
                y2="skipped",
            ),
            Plan(ready=("m",)),
        ),
        (
            "a route with no edge: every routed branch is skipped, the run ends",
            ROUTER,
            "t",
            states(t="succeeded", r=("succeeded", {"maybe"})),
            Plan(skip=("x", "y", "x2", "y2", "m", "end"), outcome=RunStatus.SUCCEEDED),
        ),
        (
            "several routes chosen",
            ROUTER,
            "t",
            states(t="succeeded", r=("succeeded", {"yes", "no"})),
            Plan(ready=("x", "y")),
        ),
        # join after a skipped branch
        (
            "join after a skipped branch fires when the live one is done",
            JOIN_AFTER_ROUTER,
            "t",
            states(t="succeeded", r=("succeeded", {"no"}), y="succeeded"),
            Plan(skip=("x",), ready=("j",)),
        ),
        (
            "join waits while the live branch runs",
            JOIN_AFTER_ROUTER,
            "t",
            states(t="succeeded", r=("succeeded", {"no"}), y="running"),
            Plan(skip=("x",)),
        ),
        (
            "a join is never skipped by propagation",
            JOIN_AFTER_ROUTER,
            "t",
            states(t="succeeded", r=("succeeded", {"neither"})),
            Plan(skip=("x", "y"), ready=("j",)),
        ),
        # trigger start-node selection
        (
            "the other start node is skipped, its edges are dead",
            TWO_STARTS,
            "t2",
            {},
            Plan(skip=("t", "manual_only"), ready=("t2",)),
        ),
        (
            "a node reached from both starts runs after the live one",
            TWO_STARTS,
            "t2",
            states(t="skipped", manual_only="skipped", t2="succeeded"),
            Plan(ready=("both",)),
        ),
        # failures
        (
            "a failed step fails the run",
            LINEAR,
            "t",
            states(t="succeeded", a="failed"),
            Plan(outcome=RunStatus.FAILED, failed=("a",)),
        ),
        (
            "continueOnFail: downstream goes on",
            CONTINUE,
            "t",
            states(t="succeeded", a="failed"),
            Plan(ready=("b",)),
        ),
        # forEach: bound and order
        (
            "forEach releases items in order up to its bound",
            FOREACH,
            "t",
            states(t="succeeded", f=("running", ["pending"] * 5)),
            Plan(items_ready=(("f", 0), ("f", 1))),
        ),
        (
            "a finished item frees a slot for the next one",
            FOREACH,
            "t",
            states(
                t="succeeded",
                f=("running", ["succeeded", "running", "pending", "pending", "pending"]),
            ),
            Plan(items_ready=(("f", 2),)),
        ),
        (
            "a retrying item keeps its slot",
            FOREACH,
            "t",
            states(t="succeeded", f=("running", ["runnable", "suspended", "pending"])),
            Plan(),
        ),
        (
            "all items done: the node is done",
            FOREACH,
            "t",
            states(t="succeeded", f=("running", ["succeeded"] * 3)),
            Plan(foreach_done=(("f", True),)),
        ),
        (
            "an item failed: the node failed",
            FOREACH,
            "t",
            states(t="succeeded", f=("running", ["succeeded", "failed", "running"])),
            Plan(foreach_done=(("f", False),)),
        ),
        (
            "forEach not yet expanded is ready like a listen",
            FOREACH,
            "t",
            states(t="succeeded"),
            Plan(ready=("f",)),
        ),
        # nothing left
        (
            "nothing open: the run succeeded",
            dag("t>a"),
            "t",
            states(t="succeeded", a="succeeded"),
            Plan(outcome=RunStatus.SUCCEEDED),
        ),
    ],
)
def test_plan(
    name: str, definition: Any, start: str, given: dict[str, NodeState], expected: Plan
) -> None:
    assert plan(definition, start, given) == expected, name


def test_start_node_follows_the_trigger_and_event_type() -> None:
    d = dag(
        "t>a t2>a t3>a t4>a",
        t={"kind": "trigger", "extras": {"triggerType": "manual"}},
        t2={
            "kind": "trigger",
            "extras": {"triggerType": "event", "eventType": "PullRequestMerged"},
        },
        t3={"kind": "trigger", "extras": {"triggerType": "event"}},
        t4={"kind": "trigger"},
    )
    assert start_node(d, "manual", None) == "t"
    assert start_node(d, "event", "PullRequestMerged") == "t2"
    assert start_node(d, "event", "TicketAssigned") == "t3"
    assert start_node(d, "schedule", None) == "t4"
    only_manual = dag("t>a", t={"kind": "trigger", "extras": {"triggerType": "manual"}})
    assert start_node(only_manual, "schedule", None) is None
    assert start_node(dag("t>a"), "webhook", None) == "t"


def test_limits() -> None:
    assert has_slot(3, 2)
    assert not has_slot(2, 2)
    assert not has_slot(2, 5)
    assert not over_budget(3, 2)
    assert over_budget(3, 3)
