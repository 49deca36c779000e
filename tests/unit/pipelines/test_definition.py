"""The definition format of DESIGN "Pipelines": parsing, errors naming node and field,
DAG checks, load warnings, declared inputs."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from forgeflow.pipelines.bodies import register_builtins
from forgeflow.pipelines.definition import (
    DefinitionError,
    StepRetryPolicy,
    load_definition,
    parse_document,
)
from forgeflow.pipelines.inputs import InputError, validate_inputs
from forgeflow.pipelines.registry import PipelineBodyRegistry
from tests.support.pipelines import dag_doc

DESIGN_EXAMPLE = """
key: pr_triage                 # template id, unique per instance
name: Triage new pull requests
version: 1
enabled: false
inputs: [{name: pr, type: integer, required: true}]      # manual-run form
config: {maxConcurrentSteps: 8, maxSteps: 500}
reducers: {findings: append}   # per state key; default override
nodes:
  - {id: trigger, kind: trigger, bodyKey: pipeline.trigger}
  - id: triage
    kind: listen
    bodyKey: conversation.promptAgent
    inputs: {prompt: "Triage PR #{{event.number}}: {{event.title}}"}
    outputKey: triage
    retry: {attempts: 2, backoff: exponential, delaySeconds: 5}
    continueOnFail: false
    extras: {mode: review}
  - {id: route, kind: router, bodyKey: pipeline.condition,
     extras: {switchKey: triage.label, cases: {bug: bug, docs: docs}, default: other}}
  - {id: done, kind: terminal}
edges:
  - {from: trigger, to: triage}
  - {from: triage, to: route}
  - {from: route, to: done, routeKey: other}
triggers:
  - {type: event, eventType: PullRequestPublished, match: {draft: false}}
  - {type: schedule, schedule: "every:86400", enabled: false}
  - {type: manual}
"""


def _bodies() -> frozenset[str]:
    registry = PipelineBodyRegistry()
    register_builtins(registry)
    return registry.keys()


def _errors(doc: Any) -> list[str]:
    with pytest.raises(DefinitionError) as caught:
        load_definition(doc, bodies=_bodies())
    return caught.value.errors


def test_the_design_example_loads_with_route_warnings() -> None:
    loaded = load_definition(parse_document(DESIGN_EXAMPLE, yaml_format=True), bodies=_bodies())
    d = loaded.definition
    assert d.key == "pr_triage" and not d.enabled
    assert d.node("triage").retry == StepRetryPolicy(
        attempts=2, backoff="exponential", delaySeconds=5
    )
    assert d.reducer("findings") == "append" and d.reducer("other") == "override"
    assert [t.type for t in d.triggers] == ["event", "schedule", "manual"]
    assert d.config.suspendedStepTimeout == 86400
    assert loaded.warnings == [
        "nodes[route].extras: route 'bug' has no edge with that routeKey; "
        "choosing it runs nothing downstream",
        "nodes[route].extras: route 'docs' has no edge with that routeKey; "
        "choosing it runs nothing downstream",
    ]
    again = load_definition(d.to_json()).definition
    assert again == d


def test_json_and_yaml_documents_and_syntax_errors() -> None:
    assert parse_document(b'{"a": 1}', yaml_format=False) == {"a": 1}
    with pytest.raises(DefinitionError, match="not valid YAML"):
        parse_document("key: [unclosed", yaml_format=True)
    with pytest.raises(DefinitionError, match="not valid JSON"):
        parse_document("{", yaml_format=False)
    assert _errors(["not", "a", "mapping"]) == [
        "document: must be a mapping with key, name, nodes, …"
    ]


def _example() -> dict[str, Any]:
    data: dict[str, Any] = parse_document(DESIGN_EXAMPLE, yaml_format=True)
    return data


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda d: d["nodes"][1]["retry"].update(backoff="fast"),
            "nodes[triage].retry.backoff: Input should be 'linear' or 'exponential'",
        ),
        (
            lambda d: d["nodes"][1]["retry"].update(attempts=0),
            "nodes[triage].retry.attempts: Input should be greater than or equal to 1",
        ),
        (
            lambda d: d["nodes"][1].update(bodykey="x"),
            "nodes[triage].bodykey: unknown field",
        ),
        (
            lambda d: d["nodes"][2].update(kind="fork"),
            "nodes[route].kind: Input should be 'trigger', 'listen', 'join', 'router', "
            "'forEach' or 'terminal'",
        ),
        (
            lambda d: d["nodes"][1].update(outputKey="not a key"),
            "nodes[triage].outputKey: String should match pattern",
        ),
        (lambda d: d["edges"][0].pop("to"), "edges[0].to: Field required"),
        (
            lambda d: d["triggers"][0].update(type="cron"),
            "triggers[0].type: Input should be 'event', 'schedule', 'manual' or 'webhook'",
        ),
        (
            lambda d: d["inputs"][0].update(type="date"),
            "inputs[pr].type: Input should be",
        ),
        (
            lambda d: d["reducers"].update(findings="concat"),
            "reducers.findings: Input should be 'override', 'append', 'mergeLists', "
            "'mergeMaps' or 'sum'",
        ),
        (
            lambda d: d["config"].update(suspendedStepTimeout="soon"),
            "config.suspendedStepTimeout: Value error, must be a number of seconds",
        ),
        (lambda d: d.pop("nodes"), "nodes: Field required"),
    ],
)
def test_field_errors_name_the_node_and_the_field(change: Any, expected: str) -> None:
    doc = copy.deepcopy(_example())
    change(doc)
    errors = _errors(doc)
    assert any(e.startswith(expected) for e in errors), errors


@pytest.mark.parametrize(
    ("edges", "nodes", "expected"),
    [
        ("t>a a>nope", {"nope": "drop"}, "edges[1].to: unknown node 'nope'"),
        ("t>a a>b b>a", {}, "edges: cycle a -> b -> a"),
        ("t>a a>a", {}, "edges[1]: an edge from 'a' to itself is a cycle"),
        ("x>a", {"x": "listen"}, "nodes: no trigger node; a pipeline starts at a trigger node"),
        ("x>a", {"x": "listen"}, "nodes[x]: no incoming edge; it could never run"),
        (
            "t>end",
            {"end": {"kind": "terminal", "bodyKey": "test.echo"}},
            "nodes[end].bodyKey: a terminal node has no body",
        ),
        ("t>a a>t", {}, "edges[1].to: a trigger node (t) has no incoming edges"),
        ("t>end end>a", {}, "edges[1].from: a terminal node (end) has no outgoing edges"),
        ("t>a a>b:yes", {}, "edges[1].routeKey: only edges leaving a router carry a routeKey"),
        ("t>a t>a", {}, "edges[1]: duplicate edge t -> a"),
        (
            "t>f",
            {"f": {"kind": "forEach", "bodyKey": "test.echo", "extras": {"iterableKey": 1}}},
            "nodes[f].extras.iterableKey: required for a forEach node",
        ),
        (
            "t>f",
            {
                "f": {
                    "kind": "forEach",
                    "bodyKey": "x",
                    "extras": {"iterableKey": "k", "maxConcurrency": 0},
                }
            },
            "nodes[f].extras.maxConcurrency: must be a positive integer",
        ),
        ("t>a", {"a": "nobody"}, "nodes[a].bodyKey: required for a listen node"),
    ],
)
def test_dag_checks(edges: str, nodes: dict[str, Any], expected: str) -> None:
    special = {k: v for k, v in nodes.items() if v in ("drop", "nobody")}
    doc = dag_doc(edges, **{k: v for k, v in nodes.items() if k not in special})
    for node_id, what in special.items():
        spec = next(n for n in doc["nodes"] if n["id"] == node_id)
        if what == "drop":
            doc["nodes"].remove(spec)
        else:
            del spec["bodyKey"]
    errors = _errors(doc)
    assert expected in errors, errors


def test_duplicate_ids_and_trigger_rows() -> None:
    doc = dag_doc("t>a")
    doc["nodes"].append(dict(doc["nodes"][1]))
    doc["triggers"] = [
        {"type": "manual"},
        {"type": "manual"},
        {"type": "event"},
        {"type": "schedule", "schedule": "sometimes"},
    ]
    errors = _errors(doc)
    assert "nodes[a]: duplicate id" in errors
    assert "triggers[1]: a template has at most one manual trigger per event type" in errors
    assert "triggers[2].eventType: required for an event trigger" in errors
    assert "triggers[3].schedule: must be 'every:<seconds>' or a cron expression" in errors


def test_unregistered_body_and_unknown_extras_are_warnings_not_errors() -> None:
    doc = dag_doc(
        "t>a a>b",
        a={"kind": "listen", "bodyKey": "no.such.body"},
        b={"kind": "listen", "bodyKey": "pipeline.trigger", "extras": {"spaceid": "x", "zzz": 1}},
    )
    loaded = load_definition(doc, bodies=_bodies())
    assert loaded.warnings == [
        "nodes[a].bodyKey: 'no.such.body' is not registered; "
        "the step will fail with unregistered_body",
        "nodes[b].extras.spaceid: unknown key, ignored (did you mean 'spaceId'?)",
        "nodes[b].extras.zzz: unknown key, ignored",
    ]


def test_a_script_with_placeholders_is_warned_about() -> None:
    doc = dag_doc(
        "t>s",
        s={"kind": "listen", "bodyKey": "pipeline.bashScript", "extras": {"script": "echo {{x}}"}},
    )
    [warning] = load_definition(doc, bodies=_bodies()).warnings
    assert warning.startswith("nodes[s].extras.script: placeholders are never rendered")


def test_durations_and_backoff() -> None:
    doc = dag_doc("t>a")
    doc["config"] = {"suspendedStepTimeout": "2h"}
    assert load_definition(doc).definition.config.suspendedStepTimeout == 7200
    doc["config"] = {"suspendedStepTimeout": 0.5}
    assert load_definition(doc).definition.config.suspendedStepTimeout == 0.5
    linear = StepRetryPolicy(attempts=4, backoff="linear", delaySeconds=2)
    exponential = StepRetryPolicy(attempts=4, backoff="exponential", delaySeconds=2)
    assert [linear.delay(n) for n in (1, 2, 3)] == [2, 4, 6]
    assert [exponential.delay(n) for n in (1, 2, 3)] == [2, 4, 8]


def test_inputs_are_checked_against_the_declared_inputs() -> None:
    d = load_definition(_example()).definition
    assert validate_inputs(d.inputs, {"pr": 7}) == {"pr": 7}
    assert validate_inputs(d.inputs, {"pr": "7"}, coerce_text=True) == {"pr": 7}
    with pytest.raises(InputError) as caught:
        validate_inputs(d.inputs, {})
    assert caught.value.errors == ["inputs.pr: required"]
    with pytest.raises(InputError) as caught:
        validate_inputs(d.inputs, {"pr": "seven", "extra": 1})
    assert caught.value.errors == [
        "inputs.extra: not a declared input",
        "inputs.pr: expected integer, got str",
    ]
    with pytest.raises(InputError) as caught:
        validate_inputs(d.inputs, {"pr": "seven"}, coerce_text=True)
    assert caught.value.errors == ["inputs.pr: expected integer"]
